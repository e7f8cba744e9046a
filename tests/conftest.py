"""The suite runs on two workers (pytest.ini), one core each: unless told otherwise
(OMP_NUM_THREADS set), each worker and every process a test starts use one thread, as
the README's timing of the suite does. Two workers of two threads on two cores would
each wait on the other."""
import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

threads = os.environ["OMP_NUM_THREADS"]
torch.set_num_threads(max(1, int(threads)) if threads.isdigit() else 1)
