import palladium.race_detect


def test_version():
    assert palladium.race_detect.__version__ == "0.1.0"
