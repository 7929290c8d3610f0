import towers

dgx1 = towers.cost.load("dgx1-v100")
for row in towers.cost.compare(dgx1, ["central", "ring", "tree"], [64 << 10, 16 << 20]):
    print(f"{row.reducer:8} {row.tensor_bytes:>9} {1e3 * row.seconds:7.3f} ms "
          f"busbw {row.busbw / 1e9:5.2f} GB/s")
