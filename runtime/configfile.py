"""A process's configuration from its command line: `--config FILE` (`key: value` lines,
Flink's key names) and `-D key=value` entries on top, parsed by `funke.common.configuration`.
Shared by the JobManager and the TaskManager (which reads the high-availability keys)."""

from __future__ import annotations

from pathlib import Path

from funke.common.configuration import (
    ClusterConfiguration,
    ConfigurationError,
    parse_config_lines,
    parse_configuration,
    parse_key_values,
)


def load_configuration(config_file: str | None, dynamic: list[str]) -> ClusterConfiguration:
    """Raises ConfigurationError listing every problem (an unreadable file included)."""
    entries: dict[str, str] = {}
    if config_file:
        try:
            text = Path(config_file).read_text()
        except OSError as exc:
            raise ConfigurationError([f"cannot read {config_file}: {exc.strerror or exc}"]) from None
        entries.update(parse_config_lines(text, config_file))
    entries.update(parse_key_values(dynamic))
    return parse_configuration(entries)
