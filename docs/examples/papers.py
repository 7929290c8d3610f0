import towers
from towers.study import papers

# Three of the papers' methods on four workers simulated on this CPU.
chosen = [m for m in papers.METHODS if m.label in ("SGD (exact mean)", "DGC 1%", "EF-signSGD")]
study = towers.compare(chosen, out="papers", devices="cpu:4", model="lenet",
                       optimizer="momentum", learning_rate=0.05, epochs=1,
                       steps_per_epoch=40, eval_steps=4, verbose=0,
                       topologies=["2x8-ethernet-10g:16"])
for row in study.rows():
    print(f"{row['reducer']:16} accuracy {row['final_accuracy']:.3f}, "
          f"{row['bytes_per_worker_per_epoch'] / 1e6:6.3f} MB per worker per epoch, "
          f"{row['bytes_vs_exact']:.3f}x SGD's")
