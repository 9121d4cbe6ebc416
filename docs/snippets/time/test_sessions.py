from localstate import TaskTestDriver

from sessions import Sessions

STORES = {"clicks": {"engine": "kv", "key_serde": "string", "value_serde": "int"},
          "session_end": {"engine": "kv", "key_serde": "string", "value_serde": "json"}}


def test_a_session_ends_after_thirty_minutes_without_a_click():
    with TaskTestDriver(Sessions, stores=STORES,
                        time={"timers": True, "allowed_lateness": "10s", "timer_key_serde": "string"}) as driver:
        driver.send("clicks", "ann", {}, timestamp=1_000.0)
        driver.send("clicks", "ann", {}, timestamp=1_600.0)   # 10 minutes later: the same session
        driver.send("clicks", "bob", {}, timestamp=1_700.0)
        driver.advance_event_time(1_600.0 + 30 * 60)          # ann's session ends, bob's goes on
        driver.commit()
        assert driver.outputs("sessions") == [("ann", {"end": 3_400.0, "clicks": 2})]
        assert driver.watermark() == 3_400.0
