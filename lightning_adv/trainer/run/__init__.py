"""Run hygiene around ``fit``: command-line arguments, run directories, callbacks,
resuming, and the filters of dependency output."""
