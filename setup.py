"""Packaging for tf-runner.

The TensorFlow distribution is `tensorflow` unless the environment variable
`TF_RUNNER_TENSORFLOW` names another one at install time. On a Cloud TPU VM,
install with `TF_RUNNER_TENSORFLOW=tensorflow-tpu pip install ".[tpu]"` so the
machine gets tensorflow-tpu and libtpu and not also the CPU wheel (both ship
the same `tensorflow` package directory and would overwrite each other).
"""

import os

import setuptools

TENSORFLOW = os.environ.get("TF_RUNNER_TENSORFLOW", "").strip() or "tensorflow"
TENSORFLOW_VERSION = ">=2.16"  # Keras 3 is the default from 2.16 on.
RAY = "ray[train]>=2.60"  # Tested with 2.60.0, whose Ray Train (v2) keeps only metrics reported with a checkpoint.
# Keras 2 and what tensorflow-gnn needs to import (docs/keras2_and_gnn.md). tensorflow-gnn itself is installed
# after, with `pip install --no-deps tensorflow-gnn==1.0.3`: its other requirements, apache-beam and google-vizier,
# serve its data and tuning tools, not its models, and pip cannot leave out a requirement's own requirements.
GNN = ["tf-keras" + TENSORFLOW_VERSION, "networkx", "pyarrow"]
# Datasets by name, 'tfds:NAME' (runner/data/tfds_files.py); tested with tensorflow-datasets 4.9.10, whose
# download_and_prepare imports importlib_resources but declares it only for Python < 3.9.
TFDS = ["tensorflow-datasets>=4.9", "importlib-resources"]

with open(os.path.join(os.path.dirname(__file__), "README.md"), encoding="utf-8") as readme:
  LONG_DESCRIPTION = readme.read()

setuptools.setup(
    name="tf-runner",
    version="0.1.0",
    description="One ml-collections config to a distributed TensorFlow training run.",
    long_description=LONG_DESCRIPTION,
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=setuptools.find_packages(include=["runner", "runner.*", "strategies", "configs"]),
    install_requires=[
        TENSORFLOW + TENSORFLOW_VERSION,
        "keras>=3",
        "absl-py>=1.0",
        "filelock>=4.3",  # The workdir lock (runner/workdir/lock.py): flock, and the holder written while held.
        "portpicker>=1.5",  # Free ports for the launcher's tasks (runner/launch.py).
        "ml-collections>=0.1.1",
        "numpy",
        "protobuf",  # Its text format, for the checkpoint list; TensorFlow depends on it anyway.
    ],
    extras_require={
        "test": [
            "pytest>=7",
            "pytest-xdist>=3",  # The suite runs its files in two processes (-n 2 --dist loadfile).
            "portpicker>=1.5",  # Also a requirement of the package (the launcher); the tests' ports too.
            "scikit-learn>=1.0",
            "tensorboard>=2.16",
            "tensorboard-plugin-profile>=2.16",
            "xprof",  # The profile plugin's own package, whose TensorBoard context tests build the plugin with.
            RAY,  # tests/runner/cluster/test_ray_train.py runs a real Ray Train job.
            *GNN,  # The tf_keras and TF-GNN tests (with tensorflow-gnn installed as the README says).
            *TFDS,  # tests/runner/data/test_tfds_datasets.py reads a TFDS dataset it prepares.
            # The code checks (pyproject.toml), pinned: a newer release may lint or format differently.
            "ruff==0.17.5",
            "pyink==26.5.1",
            "mypy==2.4.1",
        ],
        "examples": ["scikit-learn>=1.0"],
        "tpu": ["tensorflow-tpu" + TENSORFLOW_VERSION],
        # Views a run's summaries and profiles (docs/tensorboard.md); neither depends on TensorFlow.
        "tensorboard": ["tensorboard>=2.16", "tensorboard-plugin-profile>=2.16"],
        # Ray Train as a way in (runner/ray_train.py, docs/clusters.md#ray-train).
        "ray": [RAY],
        # tf_keras (Keras 2) models and TF-GNN (docs/keras2_and_gnn.md); then `pip install --no-deps tensorflow-gnn`.
        "gnn": GNN,
        # TFDS datasets by name, config.data.name='tfds:NAME' (docs/config.md#tfds-datasets-by-name).
        "tfds": TFDS,
    },
    entry_points={"console_scripts": ["tf-runner=runner.__main__:run_main", "tf-runner-launch=runner.launch:run_main"]},
)
