import palladium.shared_memory


def test_version():
    assert palladium.shared_memory.__version__ == "0.1.0"
