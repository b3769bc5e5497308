import palladium.pipeline


def test_version():
    assert palladium.pipeline.__version__ == "0.1.0"
