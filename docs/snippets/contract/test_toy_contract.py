# test_toy_contract.py
import pytest

from localstate.testing.contract import ContractSuite, EngineAdapter
from localstate.core.serdes import JsonSerde, StringSerde
from toy_engine import ToyDictFactory


class ToyAdapter(EngineAdapter):
    def factory(self):
        return ToyDictFactory()

    def key_serde(self):
        return StringSerde()

    def value_serde(self):
        return JsonSerde()

    def random_op(self, rng):
        key = f"k{rng.randrange(10)}"
        return ("delete", key) if rng.random() < 0.3 else ("put", key, rng.randrange(100))

    def apply(self, engine, op):
        getattr(engine, op[0])(*op[1:])

    def state(self, engine):
        return engine.items()

    def expected_state(self, ops):
        model = {}
        for op in ops:
            if op[0] == "put":
                model[op[1]] = op[2]
            else:
                model.pop(op[1], None)
        return sorted(model.items())


class TestToyContract(ContractSuite):
    @pytest.fixture
    def adapter(self):
        return ToyAdapter()
