"""Datasets and models: shapes, determinism, and that the offline data is learnable."""
import torch

from distkit.builtin.data import (IndexedDataset, dataset_info, digits_dataset, split,
                          synthetic_dataset)
from distkit.builtin.models import get_model


def test_digits_ship_offline_as_images_in_unit_range():
    ds = digits_dataset()
    x, y = ds[0]
    assert len(ds) == 1797 and x.shape == (1, 8, 8)
    assert 0.0 <= ds.images.min() and ds.images.max() <= 1.0
    assert set(ds.labels.tolist()) == set(range(10))


def test_synthetic_is_deterministic_and_sized():
    a, b = synthetic_dataset(100, seed=3), synthetic_dataset(100, seed=3)
    c = synthetic_dataset(100, seed=4)
    assert len(a) == 100 and torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.images, c.images)
    assert synthetic_dataset(10, shape=(3, 4, 4)).images.shape == (10, 3, 4, 4)


def test_synthetic_is_learnable_by_nearest_template():
    # A nearest-class-mean classifier on the train half must beat chance by far.
    ds = synthetic_dataset(2000, seed=0)
    x, y = ds.images.flatten(1), ds.labels
    means = torch.stack([x[:1000][y[:1000] == c].mean(0) for c in range(10)])
    pred = torch.cdist(x[1000:], means).argmin(1)
    assert (pred == y[1000:]).float().mean() > 0.9


def test_split_is_disjoint_and_reproducible():
    ds = digits_dataset()
    train, val = split(ds, seed=0)
    assert len(val) == 360 and len(train) == 1797 - 360
    assert not set(train.indices) & set(val.indices)
    assert split(ds, seed=0)[1].indices == val.indices


def test_indexed_dataset_yields_the_index():
    ds = IndexedDataset(synthetic_dataset(20))
    x, y, i = ds[7]
    assert i == 7 and x.shape == (1, 8, 8)


def test_every_model_maps_each_dataset_shape_to_ten_logits():
    for dataset in ("digits", "mnist", "cifar10"):
        info = dataset_info(dataset)
        for name in ("cnn", "mlp") + (("resnet18",) if dataset == "cifar10" else ()):
            model = get_model(name, **info)
            x = torch.randn(2, info["in_channels"], info["image_size"], info["image_size"])
            assert model(x).shape == (2, 10), (name, dataset)


def test_same_seed_gives_same_initial_weights():
    torch.manual_seed(0)
    a = get_model("cnn")
    torch.manual_seed(0)
    b = get_model("cnn")
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
