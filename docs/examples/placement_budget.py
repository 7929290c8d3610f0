import towers

towers.Trainer("cpu:2").fit(epochs=1, steps_per_epoch=3, eval_steps=2, verbose=0,
                            placement_log="run.jsonl", max_transfer_bytes=900_000)
log = towers.placement.load("run.jsonl")
print(towers.placement.summary(log))                  # what tower-placement summary prints
towers.placement.write_trace(log, "step.json")        # tower-placement trace
analysis = towers.placement.analyse(log)              # busy, idle, waits, critical path
print([link.name for link in analysis.critical_path])
print(towers.placement.check(log, towers.placement.Budget(max_total_bytes=800_000)))
