"""The command-line tools, thin layers over the library: `train` (tower-train),
`data` (tower-data), `placement` (tower-placement), `reduce_bench`
(tower-reduce-bench), `worker` (tower-worker); `common` holds their one-line
errors, `train_flags` tower-train's flags, `cost_tables` what
tower-reduce-bench prints for the cost model."""

__all__ = ["common", "cost_tables", "data", "placement", "reduce_bench", "train", "train_flags",
           "worker"]
