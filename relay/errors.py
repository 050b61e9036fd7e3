"""The project's own errors. The CLI maps them to exit codes and one readable line."""


class KtmError(Exception):
    """Base of every error ktm reports to the operator without a traceback."""

    exit_code = 1


class ConfigError(KtmError):
    """Bad configuration or usage: names the TOML key path (or file) and the bad value."""

    exit_code = 2


class FilterError(ConfigError):
    """A filter file cannot be loaded or does not honour the contract."""


class KafkaSetupError(KtmError):
    """A cluster cannot be reached, or a topic is missing or too small: nothing was relayed."""


class RelayError(KtmError):
    """The relay failed while running (after retries); what was acknowledged is committed."""


class StoppedWhileWaiting(KtmError):
    """A stop signal arrived before there was anything to do (restore --follow waiting for
    its first segments): a clean stop, not a failure."""

    exit_code = 0
