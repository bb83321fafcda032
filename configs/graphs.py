"""A TF-GNN example: random graphs generated offline and a message-passing GNN of `tfgnn.keras` layers (tf_keras).

Each example is one undirected random graph (Erdős–Rényi) of 8 to 16 nodes
whose edge probability is drawn from [0.1, 0.5], made with numpy from a fixed
seed: 1024 training and 256 evaluation graphs. Every node has 4 Gaussian
features that carry no information about the label. The label is how dense
the graph is, by its mean degree (2 * edges / nodes): 0 below 2.5 (sparse),
1 from 2.5 to below 4 (medium), 2 from 4 on (dense); about a third of the
graphs in each class. The model (`gnn`) maps the node features to a hidden
state, runs two rounds of message passing (`SimpleConv` summing over the
edges, `NextStateFromConcat`), averages the node states into the graph's
context and ends in a Dense layer with 3 logits. It reaches >= 0.9 evaluation
accuracy in 400 steps, a few seconds on a laptop CPU, under any strategy.

The data function returns (GraphTensor, label) pairs, one graph each; the
Trainer batches them, and the task (`graph_classification`) merges each
batch into one graph of components (`merge_batch_to_components`) in the
input pipeline, beside the steps, as TF-GNN's runner does.

Needs tf_keras and TensorFlow GNN (`INSTALL`); this file sets
TF_USE_LEGACY_KERAS=1 (unless it is set) when it is imported, before
TensorFlow GNN is, which needs `tf.keras` to be tf_keras.
"""

import importlib.util
import os

import ml_collections
import numpy as np

import runner
from strategies import ConfigError

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # Before anything touches tf.keras: TF-GNN needs it to be tf_keras.

INSTALL = (
    'pip install "tf-runner[gnn]" && pip install --no-deps tensorflow-gnn==1.0.3'  # docs/keras2_and_gnn.md#install
)
NUM_CLASSES = 3
MEAN_DEGREE_BOUNDS = (2.5, 4.0)  # Class i: mean degrees from bound i - 1 (inclusive) to bound i.
NODE_SET = "nodes"
EDGE_SET = "edges"
NODE_FEATURE = "features"


def _gnn_modules():
  """Returns (tf_keras, tensorflow_gnn), imported.

  Raises:
    ConfigError: either is not installed, or tf.keras was already Keras 3 when TensorFlow GNN was imported.
  """
  try:
    import tensorflow_gnn  # noqa: PLC0415  The config loads without TensorFlow; TF-GNN is optional.
    import tf_keras  # noqa: PLC0415
  except ImportError as e:
    raise ConfigError(
        f"configs/graphs.py needs tf_keras and TensorFlow GNN: {e}. Install them with: {INSTALL}; "
        "and set TF_USE_LEGACY_KERAS=1 before TensorFlow is imported."
    ) from e
  return tf_keras, tensorflow_gnn


def _check_installed():
  """Raises ConfigError naming `INSTALL` when tf_keras or TensorFlow GNN is missing, importing neither."""
  missing = [name for name in ("tf_keras", "tensorflow_gnn") if importlib.util.find_spec(name) is None]
  if missing:
    raise ConfigError(f"configs/graphs.py needs {' and '.join(missing)}, not installed. Install with: {INSTALL}")


def random_graphs(num_graphs, *, seed, min_nodes=8, max_nodes=16, num_node_features=4):
  """Returns `num_graphs` random graphs and their labels as numpy arrays, the same for the same arguments.

  Args:
    num_graphs: how many graphs.
    seed: the seed of numpy's generator, an int or a sequence of ints.
    min_nodes: the fewest nodes of a graph.
    max_nodes: the most nodes of a graph.
    num_node_features: the length of each node's feature vector.

  Returns:
    A dict of lists, one entry per graph: 'node_features' (float32
    [nodes, num_node_features]), 'sources' and 'targets' (int32 [edges], each
    undirected edge in both directions), and 'labels', an int32 array of
    class ids by mean degree (`MEAN_DEGREE_BOUNDS`).
  """
  rng = np.random.default_rng(seed)
  graphs = {"node_features": [], "sources": [], "targets": []}
  labels = []
  for _ in range(num_graphs):
    num_nodes = int(rng.integers(min_nodes, max_nodes + 1))
    edge_probability = rng.uniform(0.1, 0.5)
    sources, targets = np.nonzero(np.triu(rng.random((num_nodes, num_nodes)) < edge_probability, k=1))
    graphs["sources"].append(np.concatenate([sources, targets]).astype(np.int32))
    graphs["targets"].append(np.concatenate([targets, sources]).astype(np.int32))
    graphs["node_features"].append(rng.normal(size=(num_nodes, num_node_features)).astype(np.float32))
    labels.append(np.digitize(2 * len(sources) / num_nodes, MEAN_DEGREE_BOUNDS))
  graphs["labels"] = np.array(labels, np.int32)
  return graphs


def _graph_dataset(graphs, num_node_features):
  """Returns a tf.data.Dataset of (scalar GraphTensor, label) from `random_graphs`' arrays."""
  import tensorflow as tf  # noqa: PLC0415  The config loads without TensorFlow.

  _, tfgnn = _gnn_modules()

  def ragged(rows, dtype, inner_shape=()):
    values = np.concatenate(rows) if rows else np.zeros((0, *inner_shape), dtype)
    return tf.RaggedTensor.from_row_lengths(values, np.array([len(r) for r in rows], np.int64))

  def to_graph(node_features, sources, targets, label):
    graph = tfgnn.GraphTensor.from_pieces(
        node_sets={
            NODE_SET: tfgnn.NodeSet.from_fields(
                sizes=tf.shape(node_features)[:1], features={NODE_FEATURE: node_features}
            )
        },
        edge_sets={
            EDGE_SET: tfgnn.EdgeSet.from_fields(
                sizes=tf.shape(sources),
                adjacency=tfgnn.Adjacency.from_indices((NODE_SET, sources), (NODE_SET, targets)),
            )
        },
    )
    return graph, label

  pieces = (
      ragged(graphs["node_features"], np.float32, (num_node_features,)),
      ragged(graphs["sources"], np.int32),
      ragged(graphs["targets"], np.int32),
      graphs["labels"],
  )
  return tf.data.Dataset.from_tensor_slices(pieces).map(to_graph)


@runner.config_fields(
    num_train_examples=1024, num_eval_examples=256, min_nodes=8, max_nodes=16, num_node_features=4, seed=0
)
def random_graph_density(config, split):
  """Returns the unbatched (GraphTensor, label) pairs of `split`: 'train' shuffled anew each epoch, 'eval' in order.

  Args:
    config: config.data with the fields declared above.
    split: 'train' or 'eval'; they are different graphs (seeds [seed, 0] and [seed, 1]).

  Raises:
    ConfigError: tf_keras or TensorFlow GNN is not installed; a split other than 'train' or 'eval'; fewer than 1 node
      or more minimum than maximum nodes.
  """
  splits = {"train": (0, config.num_train_examples), "eval": (1, config.num_eval_examples)}
  if split not in splits:
    raise ConfigError(f"random_graph_density: split must be 'train' or 'eval', got {split!r}.")
  if not 1 <= config.min_nodes <= config.max_nodes:
    raise ConfigError(
        "random_graph_density needs 1 <= config.data.min_nodes <= config.data.max_nodes, got "
        f"{config.min_nodes} and {config.max_nodes}."
    )
  stream, num_graphs = splits[split]
  graphs = random_graphs(
      num_graphs,
      seed=[config.seed, stream],
      min_nodes=config.min_nodes,
      max_nodes=config.max_nodes,
      num_node_features=config.num_node_features,
  )
  dataset = _graph_dataset(graphs, config.num_node_features)
  if split == "train":
    dataset = dataset.shuffle(num_graphs, seed=config.seed, reshuffle_each_iteration=True)
  return dataset


def merged_graph_spec(num_node_features):
  """Returns the GraphTensorSpec of a batch of `random_graph_density`'s graphs merged to components: one graph."""
  empty = {"node_features": [], "sources": [], "targets": [], "labels": np.zeros([0], np.int32)}
  batches = _graph_dataset(empty, num_node_features).batch(1)
  graph_spec = batches.map(lambda graph, label: graph.merge_batch_to_components()).element_spec
  return graph_spec.relax(num_components=True, num_nodes=True, num_edges=True)


class MergedGraphClassification(runner.tasks.Classification):
  """Classification of graphs whose batches are merged to components in the input pipeline, as TF-GNN's runner does.

  `preprocess` runs in a parallel `tf.data` map beside the training steps
  (runner.Task.preprocess): merged there, a batch costs the step nothing.
  """

  def preprocess(self, features):
    """Merges a batch of graphs (a GraphTensor of shape [batch]) into one graph of `batch` components."""
    return features.merge_batch_to_components()


@runner.config_fields(from_logits=True)
def graph_classification(config):
  """Returns the `MergedGraphClassification` task: the class of each graph, its batches merged to components."""
  _gnn_modules()  # One line naming the install when TF-GNN is missing.
  return MergedGraphClassification(from_logits=config.from_logits)


def gnn_logits(graph, config):
  """Applies the GNN's layers to a symbolic scalar GraphTensor (one graph of components) and returns its logits.

  Creates its layers in one fixed order, so under the same seed two models built with it start from the same weights.

  Args:
    graph: a tf_keras symbolic GraphTensor of rank 0 with the node set and features of `random_graph_density`.
    config: config.model with the fields of `gnn`.

  Returns:
    The symbolic logits, float32 [graphs, num_classes].
  """
  tf_keras, tfgnn = _gnn_modules()
  layers = tfgnn.keras.layers

  def initial_state(node_set, *, node_set_name):
    del node_set_name  # One node set.
    return tf_keras.layers.Dense(config.hidden_units)(node_set[NODE_FEATURE])

  graph = layers.MapFeatures(node_sets_fn=initial_state)(graph)
  for _ in range(config.message_passing_rounds):
    graph = layers.GraphUpdate(
        node_sets={
            NODE_SET: layers.NodeSetUpdate(
                {EDGE_SET: layers.SimpleConv(tf_keras.layers.Dense(config.hidden_units, "relu"), "sum")},
                layers.NextStateFromConcat(tf_keras.layers.Dense(config.hidden_units, "relu")),
            )
        }
    )(graph)
  pooled = layers.Pool(tfgnn.CONTEXT, "mean", node_set_name=NODE_SET)(graph)
  return tf_keras.layers.Dense(config.num_classes)(pooled)


@runner.config_fields(hidden_units=32, message_passing_rounds=2, num_classes=NUM_CLASSES, num_node_features=4)
def gnn(config):
  """Returns the tf_keras GNN: one graph of components in (a merged batch), [components, num_classes] logits out.

  Its input is `merged_graph_spec`, what the task `graph_classification`
  makes of each batch; then `gnn_logits`.

  Args:
    config: config.model: hidden_units, message_passing_rounds, num_classes,
      and num_node_features, which must equal config.data.num_node_features.

  Raises:
    ConfigError: tf_keras or TensorFlow GNN is not installed.
  """
  tf_keras, _ = _gnn_modules()
  graph = tf_keras.layers.Input(type_spec=merged_graph_spec(config.num_node_features))
  return tf_keras.Model(graph, gnn_logits(graph, config))


def get_config():
  """Returns the config: random graphs classified by density with a tf_keras GNN, trained and evaluated.

  Raises:
    ConfigError: tf_keras or TensorFlow GNN is not installed (naming `INSTALL`).
  """
  _check_installed()
  config = ml_collections.ConfigDict()
  config.mode = "train_and_eval"
  config.data = ml_collections.ConfigDict({"name": "configs.graphs:random_graph_density", "global_batch_size": 32})
  config.model = ml_collections.ConfigDict({"name": "configs.graphs:gnn"})
  config.task = ml_collections.ConfigDict({"name": "configs.graphs:graph_classification"})
  config.optimizer = ml_collections.ConfigDict({"name": "adam", "learning_rate": 3e-3})
  config.trainer = ml_collections.ConfigDict({"train_steps": 400, "eval_every": 200, "seed": 0})
  return config
