# run_job.py: `spark-submit run_job.py job.toml spark://host:7077`
import sys

from localstate.core.config import load_job_config
from localstate.runtime.driver.progress import ProgressObserver
from localstate.runtime.spark.runner import SparkJobRunner
from localstate.tools.run import ignore_hangups, install_stop_handlers

job = load_job_config(sys.argv[1])
runner = SparkJobRunner(job, master=sys.argv[2])  # the same master as spark-submit's (the runner sets it)
observer = ProgressObserver.watch(runner)         # progress.jsonl, live.json, [job] metrics_port
try:
    context = runner.context                      # first: PySpark installs its SIGINT handler here
    signals = install_stop_handlers(runner)       # SIGTERM/SIGINT/SIGHUP, SIGQUIT: as `localstate run`
    ignore_hangups(context)                       # the JVM ignores a terminal's hang-up
    try:
        runner.run(until_drained=False)           # standing, as `localstate run`
    finally:
        context.stop()
        signals.restore()
finally:
    observer.close()
sys.exit(signals.exit_code)                       # 0, or 128 + the signal that forced the stop
