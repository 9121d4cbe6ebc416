"""docs/plugins.md, "Options": an engine reading its validated option (tests/docs/test_code_blocks.py
opens it with and without ``initial_capacity``)."""

from acme_dict import DictEngine


class SizedDictEngine(DictEngine):
    # --8<-- [start:init]
    def __init__(self, context):
        super().__init__(context)
        capacity = context.options["initial_capacity"]   # validated, defaulted: 0 when the job omits it
    # --8<-- [end:init]
        self.capacity = capacity
