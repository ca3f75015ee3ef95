"""Deprecated module: the operator-valued feature kernels moved to
:mod:`rfgp.kernels.vector_field` (the kernels stay importable from :mod:`rfgp.kernels`) and
``helmholtz_components`` to :mod:`rfgp.inference.vector_field` (and :mod:`rfgp`).
"""

from rfgp._deprecation import moved_names

_PACKAGE = "rfgp.kernels.vector_field"


__getattr__ = moved_names(
    __name__,
    {
        **{
            name: _PACKAGE
            for name in (
                "DecomposableFeatureKernel",
                "CurlFreeFeatureKernel",
                "DivFreeFeatureKernel",
                "HelmholtzFeatureKernel",
                "DIV_FREE_FACTORS",
                "div_free_factor",
                "div_free_factor_rank",
                "operator_features",
            )
        },
        "OPERATOR_SAMPLINGS": "rfgp.kernels.vector_field.factors",
        "HELMHOLTZ_COMPONENTS": "rfgp.kernels.vector_field.features",
        "helmholtz_components": "rfgp.inference.vector_field",
    },
)
