"""Input: DALI pipelines per tower, data-set inspection and checks, MNIST, record files."""
