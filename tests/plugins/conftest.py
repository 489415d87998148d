from tests.plugins.fake_plugins import fresh_plugins, sandbox  # noqa: F401
