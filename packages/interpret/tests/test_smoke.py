import palladium.interpret


def test_version():
    assert palladium.interpret.__version__ == "0.1.0"
