"""The cost layer: what a rewrite is predicted to cost on this machine, and whether to make it.

- :mod:`.model`: the analytic model, per match (:class:`Problem`) the plain graph's time and each
  candidate lowering's (:func:`predict`);
- :mod:`.decision`: a pass's decision from a prediction (:func:`decide`), on the calibration the ranks
  of a group agreed on (:func:`calibration_for`);
- :mod:`.calibration`: the machine's numbers (:class:`Calibration`), their built-in defaults and
  their cache (measured by ``python -m overlap_backend.tools.calibrate``).

Above the runtime (the model reads its chunking functions and knobs), below the passes.
"""

from .calibration import DEFAULTS, Calibration
from .decision import Decision, active, calibration_for, decide
from .model import Plan, Prediction, Problem, predict

__all__ = ["DEFAULTS", "Calibration", "Decision", "Plan", "Prediction", "Problem", "active", "calibration_for",
           "decide", "predict"]
