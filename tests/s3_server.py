"""The SeaweedFS S3 server of the tests (``localstate.changelog.objectstore.devserver``), importable
from any test package (the objectstore tests, the cluster tests)::

    server = SeaweedS3(tmp_dir).start()      # blocks until S3 answers and the bucket exists
    server.options("prefix")                 # [changelogs.objectstore] options for a job
    server.stop()                            # SIGKILL: a graceful stop takes ~10 s
"""

from localstate.changelog.objectstore.devserver import SeaweedS3, free_port, weed_binary

__all__ = ["SeaweedS3", "weed_binary", "free_port"]
