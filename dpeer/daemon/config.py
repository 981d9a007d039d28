"""The daemon's configuration: one YAML file validated by pydantic, then DPEER_* env, then flags.

Precedence, lowest first: built-in defaults, the preset's timing, the YAML file, DPEER_*
environment variables, command-line flags. The `timing` keys left unset take the preset's values
(daemon/timing.py), so `config show` prints every timing the node runs with. Unknown keys and bad values are refused with the
key's dotted path, so an operator sees exactly which line of the file is wrong.
"""

from __future__ import annotations

import difflib
import os
import re
import stat
from dataclasses import fields
from pathlib import Path
from typing import Any, Literal, Mapping

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator, model_validator

from dpeer.address import Address
from dpeer.daemon import job_name, timing as tm
from dpeer.daemon.job_name import job_refusal
from dpeer.daemon.logs import LogFormat, LogLevel
from dpeer.daemon.decide.sites import site_problem
from dpeer.security.exposure import is_loopback

PresetName = Literal["lan", "wan", "edge"]
ReductionName = Literal["exact", "fast"]
SplitName = Literal["speed", "even"]
_HOSTPORT = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")
_NODE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
NODE_ID_RULE = "1-64 letters, digits, '.', '_' or '-', starting alphanumeric"


def valid_node_id(value: str) -> bool:
    """Whether ``value`` is a node id (NODE_ID_RULE): what a box may be configured with, what a join
    may name, and so what a measured site's name (auto-<id>) may hold."""
    return _NODE_ID.fullmatch(value) is not None


class ConfigError(ValueError):
    """A config file, env variable or flag that cannot be used; the message names the key."""


def parse_hostport(value: str) -> Address:
    """Split HOST:PORT, refusing anything that is not a usable address (a stricter grammar than
    Address.parse: a name or an IP, no spaces, for what an operator types)."""
    match = _HOSTPORT.match(value.strip())
    if not match or not 0 < int(match.group(2)) < 65536:
        raise ValueError(f"{value!r} is not HOST:PORT with a port in 1..65535")
    return Address(match.group(1).strip("[]"), int(match.group(2)))


def _check_hostport(value: str) -> str:
    parse_hostport(value)
    return value.strip()


class Strict(BaseModel):
    """Base for config sections: unknown keys are errors, not silently ignored."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


MAX_SEED = 2**63 - 1
"""The largest training seed: torch.manual_seed takes a signed 64-bit integer."""

EXACT_MAX_MICRO_BATCHES = 1 << 16
"""Most micro-batches one exact step sums (trainer.fixedpoint.MAX_MICRO_BATCHES, which imports torch)."""


class TrainingConfig(Strict):
    """The run of every job: steps, global_batch, micro_batch and seed reach the job as ctx.steps ...
    and must be what its TrainSpec says (the worker refuses a spec that differs); lr and options
    are the job's to use (ctx.lr, ctx.option); the rest is the runtime's."""

    steps: int = Field(20000, gt=0, description="steps to train; the default runs for minutes")
    global_batch: int = Field(64, gt=0, description="samples per step, fixed whatever the world size")
    micro_batch: int = Field(16, gt=0, description="largest per-rank forward pass; bigger shares accumulate")
    seed: int = Field(1234, ge=0, le=MAX_SEED, description="seeds the model, the data and the sample order "
                      "(0 to 2**63-1: torch's generators take a signed 64-bit seed)")
    lr: float = Field(0.05, gt=0, description="optimizer learning rate")
    checkpoint_every: int = Field(200, ge=0, description="steps between full-state checkpoints; 0 disables")
    hang_after: float = Field(60.0, gt=0, description="seconds a started worker may go without a report "
                              "(it writes one every step and every second while idle) before it is restarted")
    stopped_after: float = Field(5.0, gt=0, description="seconds a worker may stay stopped by a signal "
                                 "(SIGSTOP, a debugger) before it is restarted")
    failure_repeats: int = Field(3, ge=2, le=100, description="a job whose same exception comes back at the "
                                 "same step this many times in a row (or whose build fails this many times) is "
                                 "halted as broken, with that reason in `dpeer status`; `dpeer job retry` restarts it")
    digest_every: int = Field(10, ge=1, description="steps between sha256 digests of the parameters (also the "
                              "last step and each group's first); the status reports the newest digested step")
    reduction: ReductionName = Field("exact", description="exact: gradients summed in fixed point, so a run "
                                     "with failures ends with the same bits as a fault-free run and a 1-box run "
                                     "(global_batch a multiple of micro_batch); fast: float32 sums, equal only to "
                                     "rounding across world sizes")
    split: SplitName = Field("speed", description="how a step's micro-batches are shared among the boxes: speed, "
                             "by each box's measured speed (the leader's views weigh them, View.shares; a box twice "
                             "as slow gets about half; in exact mode the result is the same bits, only the time "
                             "changes); even: the same share each")
    threads: int = Field(0, ge=0, description="intra-op CPU threads of the worker; 0 keeps torch's default (the "
                         "core count); exact reduction needs the same count on every box")
    spare_worker: bool = Field(True, description="keep a warm spare worker process (torch imported, about 200 MB) "
                               "while training, so a crashed worker is replaced without a fresh interpreter's imports")
    init_from: str | None = Field(None, description="a file the run's model (and its optimizer, when the file "
                                  "has one) starts from: a torch.save state dict, safetensors or a dpeer checkpoint "
                                  "(docs/checkpoints.md); the same file on every box; a committed checkpoint or a "
                                  "heal from peers takes precedence once the run has one")
    options: dict[str, str] = Field(default_factory=dict, description="extra KEY: VALUE options for the job, "
                                    "as strings (ctx.option(KEY, default) types them by the default)")

    @field_validator("options", mode="before")
    @classmethod
    def _scalars_as_text(cls, value: Any) -> Any:
        """YAML's `dim: 16` and `amp: true` are options too: they reach the job as '16' and 'true'."""
        if not isinstance(value, dict):
            return value
        return {k: (str(v).lower() if isinstance(v, bool) else str(v)) if isinstance(v, (bool, int, float)) else v
                for k, v in value.items()}

    @field_validator("init_from")
    @classmethod
    def _readable_file(cls, value: str | None) -> str | None:
        """Made absolute (against the working directory, as data_dir is); it must be a readable file."""
        if value is None:
            return None
        path = Path(value).absolute()
        if not path.is_file() or not os.access(path, os.R_OK):
            raise ValueError(f"training.init_from {path} is not a readable file")
        return str(path)

    @field_validator("seed", mode="before")
    @classmethod
    def _whole_float_as_int(cls, value: Any) -> Any:
        """YAML's 1.0e+26 is a float: as the integer it names, the bound check says what is wrong with it."""
        return int(value) if isinstance(value, float) and value.is_integer() else value

    @property
    def step_units(self) -> int:
        """The units a step's work is split in among the ranks by their shares: its micro-batches
        in exact mode, its samples in fast mode (trainer: ExactStep and FastStep)."""
        return self.global_batch // self.micro_batch if self.reduction == "exact" else self.global_batch

    @model_validator(mode="after")
    def _exact_batches(self) -> "TrainingConfig":
        if self.reduction == "exact" and self.global_batch % self.micro_batch:
            raise ValueError(f"reduction exact needs global_batch ({self.global_batch}) to be a multiple of "
                             f"micro_batch ({self.micro_batch}): a step is a fixed sequence of equal micro-batches")
        if self.reduction == "exact" and self.global_batch // self.micro_batch > EXACT_MAX_MICRO_BATCHES:
            raise ValueError(f"reduction exact sums at most {EXACT_MAX_MICRO_BATCHES} micro-batches per step, and "
                             f"global_batch {self.global_batch} / micro_batch {self.micro_batch} makes "
                             f"{self.global_batch // self.micro_batch}; raise micro_batch")
        return self


class SecurityConfig(Strict):
    """Mutual TLS between peers and a shared cluster token (make them with `dpeer certs`): required
    off loopback unless `insecure`; optional on loopback."""

    tls_cert: Path | None = Field(None, description="this node's certificate (PEM), naming dpeer://node/NODE_ID")
    tls_key: Path | None = Field(None, description="this node's private key (PEM)")
    tls_ca: Path | None = Field(None, description="CA that signs every peer's certificate (PEM)")
    cluster_token_file: Path | None = Field(None, description="file holding the shared cluster token")
    insecure: bool = Field(False, description="run off loopback without mutual TLS and token (--insecure); "
                           "logged as a warning at every start and shown in status")
    insecure_data_plane: bool = Field(False, description="run the job's data plane (collectives, heal) off loopback "
                                      "unencrypted (--insecure-data-plane); warned at every start, shown in status")
    metrics_plain: bool = Field(False, description="serve /metrics as plain HTTP although TLS is configured "
                                "(a local agent scrapes it); only on a loopback metrics_listen")

    @property
    def tls(self) -> bool:
        """Whether all three TLS files are set (mutual TLS for peers, and for /metrics)."""
        return None not in (self.tls_cert, self.tls_key, self.tls_ca)

    @field_validator("tls_cert", "tls_key", "tls_ca", "cluster_token_file")
    @classmethod
    def _exists(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"file {value} does not exist")
        return value


def _section(name: str, keys: tuple[str, ...], types: dict[str, Any], zero_ok: tuple[str, ...] = ()) -> type[Strict]:
    """A timing section: every key optional (unset: the preset's), positive (or 0 where allowed)."""
    spec: dict[str, Any] = {}
    for key in keys:
        kind = {"float": float, "int": int}[str(types[key])]
        bound = {"ge": 0} if key in zero_ok else {"gt": 0}
        spec[key] = (kind | None, Field(None, **bound))
    return create_model(name, __base__=Strict, **spec)  # type: ignore[call-overload, no-any-return]


MembershipTiming = _section("MembershipTiming", tm.MEMBERSHIP_KEYS,
                            {f.name: f.type for f in fields(tm.MembershipConfig)})
RaftTiming = _section("RaftTiming", tm.RAFT_KEYS, {f.name: f.type for f in fields(tm.RaftConfig)},
                      zero_ok=("learner_heartbeat_interval", "idle_heartbeat_interval",
                               "idle_learner_heartbeat_interval", "idle_election_timeout"))
LeaderTimingConfig = _section("LeaderTimingConfig", tm.LEADER_KEYS, {f.name: f.type for f in fields(tm.LeaderTiming)})


class TimingConfig(Strict):
    """Per-key overrides of the preset's timings; unset keys show the preset's value."""

    membership: MembershipTiming = Field(default_factory=MembershipTiming)  # type: ignore[valid-type]
    raft: RaftTiming = Field(default_factory=RaftTiming)  # type: ignore[valid-type]
    leader: LeaderTimingConfig = Field(default_factory=LeaderTimingConfig)  # type: ignore[valid-type]


class NodeConfig(Strict):
    """Everything one daemon needs; `dpeer config show` prints the effective values."""

    node_id: str | None = Field(None, description="unique, stable name of this box")
    listen: str = Field("127.0.0.1:7100", description="address the gRPC server binds, and only it")
    advertise: str | None = Field(None, description="address peers dial when it differs from listen")
    data_dir: Path = Field(Path("/var/lib/dpeer"), description="LMDB store, checkpoints and the worker's files "
                           "(DATA_DIR/worker/final.pt); a relative path is made absolute against the working directory")
    join: list[str] = Field(default_factory=list, description="live members to join through")
    preset: PresetName = Field("lan", description="timing preset: lan, wan or edge")
    site: str | None = Field(None, description="where this box stands (lab-2, a cloud region): boxes of one site "
                             "share fast links; none: measured from round trips (docs/operations.md, Sites)")
    job: str | None = Field(None, description="demo, MODULE:FUNCTION (a build function returning a TrainSpec) or "
                            "PATH.py (a training script, run as __main__; a relative path is made absolute "
                            "against the working directory); none runs a daemon only")
    metrics_listen: str | None = Field(None, description="HOST:PORT for Prometheus metrics")
    store_port: int | None = Field(None, ge=1, le=65535,
                                   description="port of the rendezvous store this node's worker hosts as rank 0 "
                                   "(bound on the advertised host when the worker starts); default: any free port, "
                                   "so it can never collide with another daemon's port")
    max_voters: int = Field(5, ge=1, le=9, description="voting members (odd: 1, 3, 5, 7 or 9); the rest are "
                            "learners")
    log_level: LogLevel = Field("info", description="least severe log records written: debug, info, warning or "
                                "error")
    log_format: LogFormat = Field("json", description="json: one JSON object a line (node, term, generation and "
                                  "fields as keys); text: one readable line a record")
    timing: TimingConfig = Field(default_factory=TimingConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    security: SecurityConfig = Field(default_factory=SecurityConfig)

    @field_validator("data_dir")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        return value.absolute()

    @field_validator("log_level", "log_format", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        """DPEER_LOG_LEVEL=WARNING means warning."""
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("max_voters")
    @classmethod
    def _odd(cls, value: int) -> int:
        if value % 2 == 0:
            raise ValueError(f"max_voters {value} is even: {value} voters survive no more failures than "
                             f"{value - 1} and every commit waits for one more; use {value - 1} or {value + 1}")
        return value

    @model_validator(mode="after")
    def _fill_timing(self) -> "NodeConfig":
        """Unset timing keys take the preset's value; the result must hold together."""
        defaults = tm.preset_values(self.preset)
        for section, values in defaults.items():
            model = getattr(self.timing, section)
            for key, value in values.items():
                if getattr(model, key) is None:
                    setattr(model, key, value)
        try:
            self.resolved_timing()
        except ValueError as exc:
            raise ValueError(f"the timing keys contradict each other: {exc}") from None
        return self

    @model_validator(mode="after")
    def _metrics_apart(self) -> "NodeConfig":
        """metrics_listen cannot share the gRPC server's port (a wildcard host overlaps every host)."""
        if self.metrics_listen is None:
            return self
        (host, port), (m_host, m_port) = parse_hostport(self.listen), parse_hostport(self.metrics_listen)
        if port == m_port and (host == m_host or {host, m_host} & {"0.0.0.0", "::"}):
            raise ValueError(f"metrics_listen {self.metrics_listen} is the gRPC listen address {self.listen}; "
                             "give metrics a port of their own")
        return self

    def resolved_timing(self) -> tm.Timing:
        """The timings the daemon runs with (the preset's, overridden key by key)."""
        return tm.resolve(self.preset, {s: getattr(self.timing, s).model_dump() for s in ("membership", "raft", "leader")},
                          self.max_voters)

    @field_validator("node_id")
    @classmethod
    def _node_id(cls, value: str | None) -> str | None:
        if value is not None and not valid_node_id(value):
            raise ValueError(f"node ids are {NODE_ID_RULE}")
        return value

    @field_validator("site")
    @classmethod
    def _site(cls, value: str | None) -> str | None:
        problem = site_problem(value) if value else ""
        if problem:
            raise ValueError(problem)
        return value or None

    @field_validator("listen", "advertise", "metrics_listen")
    @classmethod
    def _addr(cls, value: str | None) -> str | None:
        return None if value is None else _check_hostport(value)

    @field_validator("join", mode="before")
    @classmethod
    def _join(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [v for v in value.split(",") if v.strip()]
        return [_check_hostport(v) for v in value] if isinstance(value, list) else value

    @field_validator("job")
    @classmethod
    def _job(cls, value: str | None) -> str | None:
        """A script's path is made absolute here, once, so the worker finds it wherever it runs."""
        return None if value is None else job_name.resolve(value)

    @property
    def advertise_addr(self) -> str:
        """The address peers should dial."""
        return self.advertise or self.listen

    @property
    def store_bind(self) -> tuple[str, int]:
        """Where the worker binds the rendezvous store: the advertised host, on store_port (0: any
        free port, which the worker reports and the committed member record carries)."""
        return parse_hostport(self.advertise_addr)[0], self.store_port or 0


def _format(err: ValidationError, source: str) -> str:
    """One sentence naming where the bad value came from and its dotted key path.

    A file names the key (training.steps), the environment names the variable
    (DPEER_TRAINING__STEPS) and the command line names the flag (--listen).
    """
    first = err.errors()[0]
    key = ".".join(str(p) for p in first["loc"])
    msg = first["msg"].removeprefix("Value error, ")
    more = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
    if not first["loc"]:  # a check across keys (the timings): the message names them
        return f"{source}: {msg}{more}"
    if first["type"] == "extra_forbidden":
        close = _closest_key(tuple(str(p) for p in first["loc"]))
        guess = (f"did you mean {_env_name(close) if source == 'environment' else '.'.join(close)}?" if close
                 else "`dpeer config show` prints every key")
        msg = f"no such key; {guess}"
    if source == "environment":
        return f"environment variable {_env_name(first['loc'])} (config key {key}): {msg}{more}"
    if source == "flags":
        flag = "--" + str(first["loc"][0]).replace("_", "-") if first["loc"] else "(flags)"
        return f"flag {flag} (config key {key}): {msg}{more}"
    return f"{source}: config key {key}: {msg}{more}"


def _env_name(loc: tuple[Any, ...]) -> str:
    """The DPEER_* variable of a key path: ("training", "steps") is DPEER_TRAINING__STEPS."""
    return "DPEER_" + "__".join(str(p) for p in loc).upper()


def _closest_key(loc: tuple[str, ...]) -> tuple[str, ...] | None:
    """The key path a mistyped one most likely meant (a known key beside it, spelt closest), or None."""
    model: type[BaseModel] = NodeConfig
    for part in loc[:-1]:
        field = model.model_fields.get(part)
        inner = field.annotation if field is not None else None
        if not (isinstance(inner, type) and issubclass(inner, BaseModel)):
            return None
        model = inner
    close = difflib.get_close_matches(loc[-1].lower(), list(model.model_fields), n=1)
    return (*loc[:-1], close[0]) if close else None


def _nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for dotted, value in flat.items():
        node = out
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def read_file(path: Path) -> dict[str, Any]:
    """Parse one YAML config file into a mapping, with a clear error for unreadable or non-map files."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config file ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{path}: not valid YAML{where}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the config file must be a mapping of keys to values")
    return data


def from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    """DPEER_NODE_ID, DPEER_TRAINING__STEPS, ...: '__' separates nested keys. Only names whose
    first part is a config key are read (a wrong nested key is still an error); other DPEER_*
    names (DPEER_ADDR for the client commands, DPEER_SLOW for the tests) are not config."""
    flat = {}
    for name, value in environ.items():
        key = name[len("DPEER_"):].lower()
        if name.startswith("DPEER_") and key.split("__")[0] in NodeConfig.model_fields:
            flat[key.replace("__", ".")] = value
    return _nest(flat)


def load(
    path: Path | None = None,
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> NodeConfig:
    """The effective config: defaults < file < DPEER_* env < flags (None-valued flags are unset)."""
    layers: list[tuple[str, dict[str, Any]]] = []
    if path is not None:
        layers.append((str(path), read_file(path)))
    layers.append(("environment", from_env(os.environ if environ is None else environ)))
    layers.append(("flags", _nest({k: v for k, v in (flags or {}).items() if v is not None})))
    merged: dict[str, Any] = {}
    for source, layer in layers:
        try:
            NodeConfig.model_validate(_merge(merged, layer))
        except ValidationError as exc:
            raise ConfigError(_format(exc, source)) from None
        merged = _merge(merged, layer)
    return NodeConfig.model_validate(merged)


def wildcard_refusal(config: NodeConfig) -> str | None:
    """Why a listen on every interface without `advertise` cannot work (peers cannot dial 0.0.0.0), or None."""
    host = parse_hostport(config.listen)[0]
    if config.advertise is None and host in ("0.0.0.0", "::"):
        return (f"listen {config.listen} binds every interface, so peers need an address to dial: set advertise "
                "to this box's HOST:PORT on the cluster's network")
    return None


PRIVATE_FILES = ("tls_key", "cluster_token_file")
"""The security files only their owner may read (ssh's rule for a private key)."""


def open_secret_refusal(security: SecurityConfig) -> str | None:
    """Why a key or token file must not be used (group or others may access it), or None."""
    for name in PRIVATE_FILES:
        path = getattr(security, name)
        try:
            mode = stat.S_IMODE(path.stat().st_mode) if path is not None else 0
        except OSError:
            continue  # gone or unreadable: reading it says why
        if mode & 0o077:
            return (f"security.{name} {path} is mode {mode:04o}, readable by others than its owner; run "
                    f"`chmod 600 {path}` (dpeer, as ssh, uses a secret only its owner can read)")
    return None


def metrics_refusal(config: NodeConfig) -> str | None:
    """Why /metrics cannot be served as configured, or None: plain HTTP only on loopback, unless
    there is no TLS to serve it with and the node runs --insecure."""
    if config.metrics_listen is None:
        return None
    host, s = parse_hostport(config.metrics_listen).host, config.security
    if is_loopback(host):
        return None
    if s.metrics_plain:
        return (f"security.metrics_plain serves /metrics without TLS, so metrics_listen {config.metrics_listen} "
                "must be a loopback address (127.0.0.1:PORT); drop metrics_plain to serve it over TLS")
    if s.tls or s.insecure:
        return None
    return (f"metrics_listen {config.metrics_listen} is not loopback and this node has no TLS to serve /metrics "
            "with: set the security block's tls_cert, tls_key and tls_ca (client certificates of the cluster CA "
            "then read it), use a loopback address, or pass --insecure")


def check_file(path: Path) -> NodeConfig:
    """Validate one file on its own, as `dpeer config check FILE` does: the keys, then what only
    running would show (a wildcard listen no peer can dial, a key or token others can read,
    /metrics in clear off loopback, an unimportable job)."""
    try:
        config = NodeConfig.model_validate(read_file(path))
    except ValidationError as exc:
        raise ConfigError(_format(exc, str(path))) from None
    reasons = (wildcard_refusal(config), open_secret_refusal(config.security), metrics_refusal(config),
               job_refusal(config.job))
    for reason in reasons:
        if reason is not None:
            raise ConfigError(f"{path}: {reason}")
    return config
