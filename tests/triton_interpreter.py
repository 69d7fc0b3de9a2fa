"""Can this machine's Triton interpreter run a kernel loop with a runtime bound? Triton 3.6's interpreter turns a
loop bound into an int with ``int(array)`` on a one-element array, which numpy 2.5 refuses ("only 0-dimensional arrays
can be converted to Python scalars"; Triton 3.8 squeezes first). There every interpreted kernel test cannot run: it
skips with that reason, and the compiled kernels' GPU tests cover the same rules on such a machine."""

import functools
import os
import subprocess
import sys

import pytest

_PROBE = """
import torch, triton, triton.language as tl
@triton.jit
def add_up(X, N):
    acc = 0.0
    for i in tl.range(0, N):
        acc += tl.load(X + i)
    tl.store(X, acc)
x = torch.arange(1.0, 5.0)
add_up[(1,)](x, 4)
assert x[0].item() == 10.0, x
print("ok")
"""
_NUMPY_REFUSAL = "only 0-dimensional arrays can be converted to Python scalars"


@functools.lru_cache(maxsize=None)
def interpreter_problem() -> str | None:
    """Why the interpreter cannot run a runtime-bound loop here, or None (it can, or it failed some other way: then
    the test itself runs and shows that failure)."""
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=120)
    if run.returncode == 0 or _NUMPY_REFUSAL not in run.stderr:
        return None
    import numpy
    import triton

    return (f"Triton {triton.__version__}'s interpreter cannot run a loop with a runtime bound under numpy "
            f"{numpy.__version__} ({_NUMPY_REFUSAL!r}; fixed in Triton 3.8): the GPU tests run the compiled kernels")


def require_interpreter() -> None:
    """Skip the calling test, with the reason, where the interpreter cannot run our kernels' loops."""
    problem = interpreter_problem()
    if problem:
        pytest.skip(problem)
