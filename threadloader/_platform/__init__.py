"""What threadloader needs of its platform, each behind one module.

* :mod:`.torch_compat` -- the one adapter for torch's private data-loading API
  (version shims only);
* :mod:`.fork` -- what must be renewed or hidden in a forked child (locks,
  private file descriptors);
* :mod:`.interpreter` -- the interpreter's build (free-threaded or not, GIL on or off);
* :mod:`.thread_origin` -- which thread started each Python thread;
* :mod:`.malloc` -- glibc's malloc thresholds, raised once before worker threads start.
"""
