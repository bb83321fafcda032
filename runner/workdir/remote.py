"""Which paths are remote: a URL of a TensorFlow filesystem (`gs://`, `s3://`, `hdfs://`, `ram://`, ...), read and
written only through `tf.io.gfile`.

A remote filesystem may lack what a local one has: appending in place,
an exclusive create, file locks, renames that are atomic, modification times.
The workdir's files are laid out so that none of these is needed there
(`runner.outputs.metrics_file`, `runner.workdir.lock`).
"""


def is_remote(path: str) -> bool:
  """Whether `path` is a URL (`scheme://...`) rather than a local path."""
  return "://" in path
