"""Builds the fused render kernel (a C extension) with the compiler pip finds; everything else is in pyproject.toml.

The flags pin the arithmetic: no FMA contraction, no fast-math, no -march, so each float
operation is one IEEE-754 operation in the written order on every x86-64 CPU (docs/kernel.md).
"""

from setuptools import Extension, setup

KERNEL_FLAGS = [
    "-O3",
    "-std=c99",
    "-ffp-contract=off",
    "-fno-fast-math",
    "-fno-math-errno",
    "-fexcess-precision=standard",
    # Python's own CFLAGS, which setuptools puts before these, carry -fwrapv (for CPython's
    # code); in the kernel's loops it cost 3-11 % of the kernel's time (bench/route.py --what
    # kernel, 2026-12-03). The kernel never relies on a signed integer wrapping.
    "-fno-wrapv",
]

setup(
    ext_modules=[
        Extension(
            "pixpool.server.augment._kernel",
            ["server/augment/_kernel.c"],
            depends=["server/augment/_kernel_hsv.h"],
            extra_compile_args=KERNEL_FLAGS,
        )
    ]
)
