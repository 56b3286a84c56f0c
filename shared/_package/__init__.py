"""pixpool: a shared-memory data service for training object detectors.

The installed package's root; it imports nothing, so ``import pixpool.client`` costs only
the trainer side. The sides live in the repository's top-level folders and are installed as
``pixpool.server``, ``pixpool.client``, ``pixpool.shared`` and ``pixpool.integrations``
(pyproject.toml, ``package-dir``).

Why a regular package and why this folder: as a namespace package (no ``__init__.py``),
``pixpool`` would merge any ``pixpool/`` folder on ``sys.path`` into itself, and a source
checkout named ``pixpool`` in the working directory would take over ``pixpool.shared``. A
regular package installed in site-packages is found before any namespace portion. This
file lives at ``shared/_package/`` rather than in a ``pixpool/`` folder at the repository
root: a folder of that name there would itself be a regular ``pixpool`` package, holding
only this file, that shadows the installed one for anything run from the repository root.
"""

__all__: list[str] = []
