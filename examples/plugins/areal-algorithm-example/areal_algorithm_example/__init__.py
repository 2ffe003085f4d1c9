"""areal-algorithm-example: registers the ``cispo`` algorithm (``actor.algorithm: cispo``).

Only hook implementations live here; the class is named by path so discovery stays torch-free.
"""

from areal_core.api import hookimpl


@hookimpl
def areal_register_algorithms(register):
    register("cispo", "areal_algorithm_example.cispo:CISPO")
