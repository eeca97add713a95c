"""Fixtures that several test modules share, registered once for tests/ so a session scope really is one.

A fixture imported from a helper module into several test modules is a separate fixture in each of them
(pytest registers fixtures per module), so each module would build its own "session" copy. The real-model
import (`real_model_support.py`: 20-35 s and 1.3 GB each time) is therefore registered here, and test modules
just name `smollm2_import` or `smollm2_dir` as an argument.
"""

from real_model_support import smollm2_dir, smollm2_import  # noqa: F401
