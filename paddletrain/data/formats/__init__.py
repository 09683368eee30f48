"""Data as users keep it: image folders (scanned, cached), PaddleClas label lists, MNIST and CIFAR archives, the
embedded shapes, unlabeled images, and reading one image file. Each dataset module registers its builder
(:mod:`paddletrain.data.datasets`)."""
