"""Which paths are remote: URLs of TensorFlow filesystems, read and written only through `tf.io.gfile`.

Remote paths are `gs://`, `s3://`, `hdfs://`, `ram://` and the like. A
remote filesystem may lack what a local one has: appending in place, an
exclusive create, file locks, atomic renames, modification times. The
workdir's files are laid out so that none of these is needed there
(`runner.outputs.metrics_file`, `runner.workdir.lock`).
"""


def is_remote(path: str) -> bool:
  """Whether `path` is a URL (`scheme://...`) rather than a local path."""
  return "://" in path
