r"""scikit-learn estimators on top of :class:`rfgp.RandomFeatureGP` and
:class:`rfgp.DirichletGPClassifier` (the ``sklearn`` extra: ``pip install "rfgp[sklearn]"``).

Both estimators take numpy arrays (or anything :func:`sklearn.utils.validation.validate_data`
accepts), return numpy arrays, compute in float64, and work in ``Pipeline``, ``GridSearchCV``
and ``clone``. The kernel is either named by a string, built from the estimator's
hyperparameters (``num_features``, ``sampling``, ``lengthscale``, ...), or given as an rfgp
kernel, which is deep-copied at ``fit`` (the object passed in is never changed).

Kernel names (:data:`KERNELS`):

========================  =================================================================
``"rbf"``                 :class:`~rfgp.kernels.FourierFeatureKernel` (``spectral="rbf"``),
                          :math:`\exp(-\|x - y\|^2 / 2\ell^2)`
``"matern12"``, ...32/52  :class:`~rfgp.kernels.FourierFeatureKernel`, Matérn
                          :math:`\nu = 1/2, 3/2, 5/2`
``"polynomial"``          :class:`~rfgp.kernels.PolynomialSketchKernel`,
                          :math:`(x^\top y / \ell^2 + b)^p`
``"exponential"``         :class:`~rfgp.kernels.MaclaurinKernel` (``target="exponential"``),
                          :math:`\exp(x^\top y / \ell^2)`
``"gaussian_maclaurin"``  :class:`~rfgp.kernels.MaclaurinKernel` (``target="gaussian"``)
``"gaussian_sketch"``     :class:`~rfgp.kernels.GaussianSketchKernel` (Phillips & Tai)
========================  =================================================================
"""


from rfgp.sklearn._classifier import RandomFeatureGPClassifier
from rfgp.sklearn._regressor import RandomFeatureGPRegressor
from rfgp.sklearn._support import KERNELS, InvalidParameterError, make_kernel

__all__ = [
    "InvalidParameterError",
    "KERNELS",
    "make_kernel",
    "RandomFeatureGPRegressor",
    "RandomFeatureGPClassifier",
]
