"""Octavo's plugin system (pluggy, project name ``octavo``).

A plugin is a module named by an entry point in the ``octavo.plugins`` group
that implements any of the hooks in :mod:`octavo.plugins.hookspecs` and
declares the plugin API version it was written against::

    # my_plugin.py
    from octavo.plugins import hookimpl

    OCTAVO_PLUGIN_API_VERSION = "1.1"

    @hookimpl
    def octavo_platforms():
        return [MyPlatform]

The in-tree platforms, models and quantization methods are registered
through exactly this mechanism (``octavo.plugins.builtin``).
"""

import pluggy

PROJECT_NAME = "octavo"
ENTRY_POINT_GROUP = "octavo.plugins"
# Major.minor: a plugin built for another major version is refused, and so
# is one built for a newer minor version. 1.1 added the octavo_layer_ops hook;
# 1.2 the fp8 layer ops that fuse the activation quantizer into the op before;
# 1.3 the encoder_attention layer op; 1.4 the fused_moe_routed layer op;
# 1.5 the layer ops that fuse the residual add and norm into the GEMV after;
# 1.6 the layer_norm layer op.
API_VERSION = "1.7"

hookimpl = pluggy.HookimplMarker(PROJECT_NAME)
hookspec = pluggy.HookspecMarker(PROJECT_NAME)

__all__ = ["API_VERSION", "ENTRY_POINT_GROUP", "PROJECT_NAME", "hookimpl", "hookspec"]
