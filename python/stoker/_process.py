"""The process that made a loader. A child forked from it (DataLoader
workers, multiprocessing with "fork") copies the loader but not its native
threads: its calls are refused at once, naming why, rather than waiting
forever for batches no thread will make."""
import os


class OwnerProcess:
    __slots__ = ("_pid", "_what")

    def __init__(self, what):
        self._pid, self._what = os.getpid(), what

    def check(self):
        if os.getpid() != self._pid:
            raise RuntimeError("this %s was created in process %d; a forked child (process %d) cannot use it, since "
                               "its native threads did not survive the fork: create a new %s in the child "
                               "(DataLoader workers and multiprocessing with 'fork' copy it)"
                               % (self._what, self._pid, os.getpid(), self._what))
