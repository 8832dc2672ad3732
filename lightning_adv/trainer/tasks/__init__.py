"""Tasks: where a user looks to add one.

- :mod:`.base`: the :class:`Task` base class, :class:`Sample`, :class:`Turn`, the
  character :class:`Vocab`;
- :mod:`.builtin`: the built-in tasks (``reverse``, ``addition``, ``guess``,
  ``calculator``) and their process scorers;
- :mod:`.text`: the JSON-lines prompt dataset task and the record generators;
- :mod:`.episode`: one episode as the policy and the environment fill it;
- :mod:`.runtime`: :class:`TaskConfig` (``model.task``) and :class:`TaskRuntime`, which
  checks every call into task, reward and scorer code.

Every public name is importable from here by dotted path
(``lightning_adv.trainer.tasks.position_match``, ``lightning_adv.trainer.tasks.Task``).
"""

from lightning_adv.trainer.tasks.runtime import *  # noqa: F401,F403 -- the dotted-path names
from lightning_adv.trainer.tasks.runtime import __all__  # noqa: F401
