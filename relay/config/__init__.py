"""Configuration: one TOML file read by `load_config` into frozen dataclasses.

Every error is a ConfigError whose single line names the full TOML key path and the bad value, so
the operator can fix the file without reading code. Unknown keys are errors: a misspelt key must
fail loudly instead of silently leaving a default in force.

Each dataclass field read from TOML names its reader in its metadata (`_reads`), so a key's type,
default and checks sit on one line; `_build` reads a whole table that way.
"""

from relay.config.choices import (
    COMPRESSIONS,
    LOG_LEVELS,
    ON_ERROR,
    ON_MISMATCH,
    SASL_MECHANISMS,
)
from relay.config.load import load_config
from relay.config.model import (  # the sections too (relay.config.sections)
    AclsConfig,
    AppConfig,
    ClusterConfig,
    Config,
    DiscoverConfig,
    FetchConfig,
    FilterConfig,
    GroupsConfig,
    LimitsConfig,
    SourcePoolConfig,
    SparkConfig,
    StoreConfig,
    TargetConfig,
    TopicRoute,
    VerifyConfig,
)
from relay.config.readers import (
    Secret,
    parse_duration,
    parse_size,
)

__all__ = [
    "AclsConfig",
    "COMPRESSIONS",
    "LOG_LEVELS",
    "ON_ERROR",
    "ON_MISMATCH",
    "SASL_MECHANISMS",
    "AppConfig",
    "ClusterConfig",
    "Config",
    "DiscoverConfig",
    "FetchConfig",
    "FilterConfig",
    "GroupsConfig",
    "LimitsConfig",
    "Secret",
    "SourcePoolConfig",
    "SparkConfig",
    "StoreConfig",
    "TargetConfig",
    "TopicRoute",
    "VerifyConfig",
    "load_config",
    "parse_duration",
    "parse_size",
]
