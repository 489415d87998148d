from tests.platforms.stand_ins import vendor_env  # noqa: F401
from tests.plugins.fake_plugins import fresh_plugins, sandbox  # noqa: F401
