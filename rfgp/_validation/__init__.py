"""Argument checks shared by every module of rfgp: scalar checks (:mod:`._scalars`), tensor
checks of data content (:mod:`._tensors`) and the declared parameter constraints that the
public entry points check their arguments against (:mod:`._constraints`)."""

from rfgp._validation._constraints import (  # noqa: F401
    BOOLEAN,
    Boolean,
    Constraint,
    InstanceOf,
    Integral,
    Interval,
    Options,
    Real,
    describe_constraints,
    validate_parameters,
)
from rfgp._validation._scalars import (  # noqa: F401
    MAX_COUNT,
    MAX_SEED,
    check_bool,
    check_choice,
    check_dtype,
    check_generator,
    check_int,
    check_positive,
    check_real,
    check_seed,
    describe,
)
from rfgp._validation._tensors import (  # noqa: F401
    EVIDENCE_DTYPES,
    KERNEL_INPUT_DTYPES,
    all_finite,
    check_active_dims,
    check_class_targets,
    check_evidence_rows,
    check_finite,
    check_integer_tensor,
    check_kernel_input,
    check_long_tensor,
    check_positive_values,
    check_real_values,
    check_rows,
    check_tensor,
    select_active_columns,
)
