"""The ``csv`` sink: one row per training step in ``RUN_DIR/scalars.csv``, the keys of the first step as columns."""

import csv

from areal_core.api import StatsSink


class CsvSink(StatsSink):
    takes_tables = False  # no sample tables: log_samples is never called
    rewrites_history = True  # a recovered run rewrites the file, so its rows may be sent again

    def __init__(self, run):
        path, self.columns, self.rows = run.run_dir / "scalars.csv", None, []
        if run.resume_step and path.exists():  # a recovered run: keep the rows up to its recover point
            with path.open(newline="") as f:
                self.rows = [row for row in csv.DictReader(f) if int(row["step"]) <= run.resume_step]
        self.file = path.open("w", newline="")

    def log_scalars(self, step, scalars):
        if step == 0:
            return  # step 0 has only the accuracy before training
        if self.columns is None:
            self.columns = ["step", *sorted(scalars)]
            self.writer = csv.DictWriter(self.file, self.columns, extrasaction="ignore")
            self.writer.writeheader()
            self.writer.writerows(self.rows)
        self.writer.writerow({"step": step, **scalars})
        self.file.flush()

    def close(self):
        self.file.close()
