import towers

study = towers.compare(["central", "powersgd:rank=2"], out="study", devices="cpu:2",
                       model="lenet", epochs=2, steps_per_epoch=40, eval_steps=10, verbose=0,
                       topologies=["2x8-ethernet-100g:16"])
for row in study.rows():
    predicted = row["predicted"]["2x8-ethernet-100g:16"]
    print(f"{row['reducer']:16} accuracy {row['final_accuracy']:.3f}, "
          f"{row['bytes_vs_exact']:.3f}x the exact mean's bytes, "
          f"{predicted['reduction_ms']:.2f} ms to reduce on 16 GPUs")
