"""Sub-commands of the ``pixpool`` CLI; each module has ``configure(parser, name)`` and ``run(args)``."""
