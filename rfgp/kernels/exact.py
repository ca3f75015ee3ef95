"""Deprecated module: its kernels moved to :mod:`rfgp.kernels.dot_product` and
:mod:`rfgp.kernels.vector_field.exact` (all of them stay importable from :mod:`rfgp.kernels`).
"""

from rfgp._deprecation import moved_names

_DOT_PRODUCT = "rfgp.kernels.dot_product"
_VECTOR_FIELD = "rfgp.kernels.vector_field.exact"


__getattr__ = moved_names(
    __name__,
    {
        "DotProductKernel": _DOT_PRODUCT,
        "DotProductBias": _DOT_PRODUCT,
        "CurlFreeKernel": _VECTOR_FIELD,
        "DivFreeKernel": _VECTOR_FIELD,
        "HelmholtzKernel": _VECTOR_FIELD,
        "curl_free_gaussian": _VECTOR_FIELD,
        "div_free_gaussian": _VECTOR_FIELD,
        "vector_field_normalizer": _VECTOR_FIELD,
        "register_helmholtz_parameters": _VECTOR_FIELD,
    },
)
