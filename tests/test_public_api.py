"""What is public is a decision: every package's `__all__` is pinned here
(as Sonnet's api_test does), and every name in it exists and is documented."""

import importlib
import inspect

import pytest

PUBLIC = {
    "towers": ["RunError", "Shard", "TowerError", "Trainer", "UsageError", "UserCodeError",
               "__version__", "callbacks", "compare", "cost", "data", "models", "placement",
               "reducers", "study"],
    "towers.callbacks": ["Callback", "EarlyStopping"],
    "towers.study": ["Method", "Run", "Scale", "Study", "compare", "papers", "predict"],
    "towers.study.papers": ["METHODS", "STUDIES", "TOPOLOGIES", "NamedStudy"],
    "towers.cost": ["Fit", "FitOptions", "MODELLED", "Prediction", "QUICK", "Row", "Schedule",
                    "Task", "Topology", "TopologyError", "builtin_topologies", "bus_factor",
                    "compare", "crossover", "dump", "fastest", "fit", "load", "predict",
                    "reducers_for", "towers_of", "trace_reduction"],
    "engine.cost": ["check", "compare", "fit", "model", "schedule", "timing", "topology"],
    "towers.placement": ["Analysis", "Budget", "analyse", "check", "load", "summary",
                         "write_trace"],
    "towers.data": ["DEFAULT_MNIST", "Shard", "Source", "directory", "mnist", "pipeline",
                    "synthetic", "text"],
    "towers.reducers": ["ALGORITHMS", "BUILT_INS", "LocalSGD", "PowerSGD", "ReducerContext",
                        "ReducerTestBase", "SignSGD", "StatefulReducer", "TopK", "all_gather",
                        "all_reduce", "broadcast", "check", "parameters", "reduce_scatter"],
    "engine.reducers": ["BUILT_INS", "Reducer", "ReducerContext", "ReducerError",
                        "ReducerOptions", "STATEFUL", "StatefulReducer", "build", "build_state",
                        "parameters", "stateful_part"],
    "towers.models": ["ModelError", "ZOO", "builder", "default_input_shape", "input_kind", "lenet",
                      "mlp",
                      "model_name", "resnet20", "resnet50", "resolve", "transformer"],
    "towers.cli": ["common", "cost_tables", "data", "placement", "reduce_bench", "train",
                   "train_flags",
                   "worker"],
    "engine": ["core", "cost", "data", "errors", "placement", "quiet", "reducers", "run",
               "scopes", "topology", "userfn"],
    "engine.core": ["loop", "loss_scale", "losses", "on_device", "options", "outputs",
                    "precision", "progress", "step", "variables"],
    "engine.data": ["DataError", "DataOptions", "DatasetInfo", "FORMATS", "GpuUnavailableError",
                    "PipelineFunction", "Shard", "class_folders",
                    "eval_batches", "inspect", "sample_shape", "shard_range", "tower_dataset",
                    "tower_pipeline", "valid_counts"],
    "engine.run": ["build", "checkpoint", "choices", "describe", "guard", "options", "outputs",
                   "session", "signals",
                   "summaries", "train", "watchdog", "watchers"],
    "engine.placement": ["analysis", "budgets", "log", "overlap", "profile", "reasons", "render",
                         "report", "summary", "tensorboard", "timeline", "trace"],
    "engine.topology": ["cluster", "devices", "process", "splits"],
    "engine.errors": ["ARGUMENTS", "RunError", "TowerError", "UsageError", "declare", "is_argument",
                      "render"],
    "engine.userfn": ["UserCodeError", "calling", "check_signature", "label", "load_function",
                      "parameters", "spec_arguments"],
}


@pytest.mark.parametrize("package", sorted(PUBLIC))
def test_all_is_pinned_and_every_name_exists(package):
    module = importlib.import_module(package)
    assert sorted(module.__all__) == sorted(PUBLIC[package])
    for name in module.__all__:
        if not hasattr(module, name):  # a submodule
            importlib.import_module(f"{package}.{name}")
        assert hasattr(module, name), f"{package}.{name}"


def test_what_users_call_is_documented():
    import towers

    undocumented = []
    for owner in (towers.Trainer, towers.Trainer.fit, towers.Trainer.evaluate,
                  towers.data.pipeline, towers.data.mnist, towers.data.directory,
                  towers.data.synthetic, towers.data.text, towers.Shard, *(
                      getattr(towers.reducers, name) for name in towers.reducers.__all__
                      if name not in ("ALGORITHMS", "BUILT_INS")), *(
                      getattr(towers.placement, name) for name in towers.placement.__all__), *(
                      getattr(towers.cost, name) for name in towers.cost.__all__
                      if name not in ("MODELLED", "QUICK"))):
        doc = inspect.getdoc(owner) or ""
        if not doc or (inspect.isfunction(owner) and "Returns:" not in doc):
            undocumented.append(owner.__qualname__)
    assert undocumented == []
