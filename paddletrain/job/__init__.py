"""What runs and supervises processes: the launcher around ``paddle.distributed.launch`` (launcher), restarts of a
lost or hung job (restart, watchdog), SLURM (slurm), the ranks' collectives and outcomes (distributed), who owns
SIGTERM/SIGINT/SIGUSR1 and the stop request (processes), per-process setup (runtime: device, threads, seeds)
and the run directory's lock (rundir). A stop request starts and ends here.
"""
