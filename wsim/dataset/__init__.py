"""``wsim dataset``: render scenes × sensors × frames × variants into a dataset folder, on local worker processes or
a Ray cluster, resumable, as MCAP (Foxglove's well-known schemas) and a plain folder layout (PLY + PNG + JSON).

    from wsim.dataset import load_spec, plan_dataset, run_dataset
    summary = run_dataset("spec.yaml", "out/dataset", workers=2)   # or ray="auto" / ray="ray://head:10001"

See README "Datasets" for the spec format and the layout of the folder.
"""

from .plan import Plan, ShardTask, plan_dataset
from .runner import DatasetSummary, print_summary, run_dataset
from .spec import DatasetSpec, SpecError, load_spec, parse_spec

__all__ = ["DatasetSpec", "DatasetSummary", "Plan", "ShardTask", "SpecError", "load_spec", "parse_spec",
           "plan_dataset", "print_summary", "run_dataset"]
