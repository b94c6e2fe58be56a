"""L1: Numba kernels over plain arrays (float32/float64 values or uint bit views).

Kernels never see ml_dtypes dtypes: callers pass bit views or exactly decoded float32 values.
"""
