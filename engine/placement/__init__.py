"""The placement log: capture where every op ran, report it, draw it."""
