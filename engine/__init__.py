"""tower-train's runtime: devices, data, towers' step, reduction, loop."""
