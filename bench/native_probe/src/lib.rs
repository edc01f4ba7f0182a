//! Trajectory assembly (`streams.trajectory.assemble`) in Rust, to measure what native code would save the worker.
//!
//! A measuring tool, not a part of the worker: `python -m bench.native_probe` builds it, holds every record it
//! assembles to the Python function's, and times both. Two ways in:
//!
//! * `Probe.assemble(events)` reads the owner's cached events (Python objects) as the worker holds them;
//! * `Store.add(payloads)` parses canonical payloads (JSON text) into events of its own, and `Store.assemble`
//!   folds those, so no Python object is read.
//!
//! Both hand the record back as a `TrajectoryRecord` (Python), as the rest of the derivation needs it; the
//! `read`, `fold` and `values` methods stop earlier, so that each step's cost can be told apart.

use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedStr;
use pyo3::types::{
    PyBool, PyDateAccess, PyDateTime, PyString, PyTimeAccess, PyTuple, PyType, PyTzInfo, PyTzInfoAccess,
};
use serde::Deserialize;
use std::collections::HashMap;

const QUEUED: u8 = 0;
const STARTED: u8 = 1;
const FINISHED: u8 = 2;
const FAILED: u8 = 3;
const VERDICT: u8 = 4;
const SNAPSHOT: u8 = 5;
const RESUMED: u8 = 6;
const INTERRUPTED: u8 = 7;
const OTHER: u8 = 255;

const DAY_US: i64 = 86_400_000_000;

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
    era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468
}

fn civil_from_days(z: i64) -> (i32, u8, u8) {
    let z = z + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y as i32, m as u8, d as u8)
}

/// `(later - earlier).total_seconds()` of two times in microseconds: CPython divides the exact integer
/// microseconds by 10**6, correctly rounded, as this does below 2**53 microseconds (285 years).
fn seconds(later: i64, earlier: i64) -> f64 {
    (later - earlier) as f64 / 1e6
}

/// What assembly reads of one event (every event class's fields in one struct; absent ones are None), its texts
/// as `S`: owned `String`s parsed from a payload, or `PyBackedStr`s that borrow the cached event's own strings.
#[derive(Deserialize)]
#[serde(bound = "S: Deserialize<'de>")]
struct Fields<S> {
    #[serde(default)]
    event_type: Option<S>,
    #[serde(default)]
    event_id: Option<S>,
    #[serde(default)]
    occurred_at: Option<S>,
    run_id: S,
    #[serde(default)]
    trajectory_id: Option<S>,
    #[serde(default)]
    domain: Option<S>,
    #[serde(default)]
    task_id: Option<S>,
    #[serde(default)]
    attempt: Option<i64>,
    #[serde(default)]
    environment_version: Option<S>,
    #[serde(default)]
    policy_version: Option<i64>,
    #[serde(default)]
    sandbox_id: Option<S>,
    #[serde(default)]
    termination: Option<S>,
    #[serde(default)]
    steps: Option<i64>,
    #[serde(default)]
    tokens: Option<i64>,
    #[serde(default)]
    artifact_digest: Option<S>,
    #[serde(default)]
    oldest_policy_version: Option<i64>,
    #[serde(default)]
    newest_policy_version: Option<i64>,
    #[serde(default)]
    failure_class: Option<S>,
    #[serde(default)]
    origin: Option<S>,
    #[serde(default)]
    verifier_id: Option<S>,
    #[serde(default)]
    verifier_version: Option<S>,
    #[serde(default)]
    verdict: Option<S>,
    #[serde(default)]
    reward: Option<f64>,
    #[serde(default)]
    bytes: Option<i64>,
    #[serde(default)]
    succeeded: Option<bool>,
    #[serde(default)]
    steps_restored: Option<i64>,
    #[serde(default)]
    reason: Option<S>,
}

impl<S> Fields<S> {
    fn new(run_id: S) -> Self {
        Fields {
            event_type: None,
            event_id: None,
            occurred_at: None,
            trajectory_id: None,
            domain: None,
            task_id: None,
            attempt: None,
            environment_version: None,
            policy_version: None,
            sandbox_id: None,
            termination: None,
            steps: None,
            tokens: None,
            artifact_digest: None,
            oldest_policy_version: None,
            newest_policy_version: None,
            failure_class: None,
            origin: None,
            verifier_id: None,
            verifier_version: None,
            verdict: None,
            reward: None,
            bytes: None,
            succeeded: None,
            steps_restored: None,
            reason: None,
            run_id,
        }
    }
}

struct Event<S> {
    id: u128,
    at: i64,
    kind: u8,
    fields: Fields<S>,
}

/// A trajectory's record with native values, in `TrajectoryRecord`'s field order.
struct Record<'a> {
    run_id: &'a str,
    trajectory_id: &'a str,
    domain: &'a str,
    task_id: &'a str,
    attempt: i64,
    environment_version: &'a str,
    status: &'static str,
    sandbox_id: &'a str,
    policy_version: Option<i64>,
    oldest: Option<i64>,
    newest: Option<i64>,
    queued_at: Option<i64>,
    started_at: Option<i64>,
    finished_at: Option<i64>,
    wait_s: Option<f64>,
    run_s: Option<f64>,
    termination: &'a str,
    steps: i64,
    tokens: i64,
    artifact: &'a str,
    env_failed: bool,
    failure_class: &'a str,
    failure_origin: &'a str,
    failures: i64,
    model_error: bool,
    verdict: &'a str,
    verifier_id: &'a str,
    verifier_version: &'a str,
    verified_digest: &'a str,
    verdict_at: Option<i64>,
    reward: Option<f64>,
    digest_match: bool,
    decided: bool,
    passed: bool,
    undecidable_reason: &'static str,
    claimed_complete: bool,
    lag_versions: Option<i64>,
    lag_seconds: Option<f64>,
    snapshots: i64,
    snapshot_bytes: i64,
    resumes: i64,
    resumes_succeeded: i64,
    steps_restored: i64,
    interruption_reasons: Vec<&'a str>,
    revision: i64,
}

/// The run's policy versions (`VersionTimeline`'s derived arrays, times in microseconds).
struct Timeline {
    times: Vec<i64>,
    newest_so_far: Vec<i64>,
    by_version: Vec<i64>,
    earliest_from: Vec<i64>,
}

fn text<S: AsRef<str>>(value: &Option<S>) -> &str {
    value.as_ref().map_or("", |v| v.as_ref())
}

/// `assemble`'s fold of one trajectory's events (any order, duplicates allowed); None without events.
fn fold<'a, S: AsRef<str>>(
    events: &'a [Event<S>],
    timeline: &Timeline,
    timeout_us: i64,
    timeout_s: f64,
) -> Option<Record<'a>> {
    // The last event of each id (as a dict built from the list keeps it), then by (time, id).
    let mut order: Vec<usize> = (0..events.len()).collect();
    order.sort_by(|a, b| events[*a].id.cmp(&events[*b].id).then(a.cmp(b)));
    let mut kept: Vec<&Event<S>> = Vec::with_capacity(order.len());
    for (i, idx) in order.iter().enumerate() {
        if i + 1 == order.len() || events[order[i + 1]].id != events[*idx].id {
            kept.push(&events[*idx]);
        }
    }
    kept.sort_by(|a, b| a.at.cmp(&b.at).then(a.id.cmp(&b.id)));
    let first = &kept.first()?.fields;
    let of = |kind: u8| -> Vec<&Event<S>> { kept.iter().copied().filter(|e| e.kind == kind).collect() };
    let (queued, started, finished, failures) = (of(QUEUED), of(STARTED), of(FINISHED), of(FAILED));
    let (verdicts, snapshots, resumes, interrupts) = (of(VERDICT), of(SNAPSHOT), of(RESUMED), of(INTERRUPTED));
    let q = queued.first().map(|e| &e.fields);
    let s = started.first().map(|e| &e.fields);
    let f = finished.last().copied();
    let domain = match q {
        Some(q) => text(&q.domain),
        None => text(&first.domain),
    };
    let env_failure = failures.iter().position(|e| text(&e.fields.origin) == "environment");
    let main_failure = env_failure.or(if failures.is_empty() { None } else { Some(0) }).map(|i| &failures[i].fields);
    let env_failed = env_failure.is_some();
    let finished_at = f.map(|f| f.at);
    // The latest verdict within the timeout after the finish, else the latest verdict at all.
    let verdict = match finished_at {
        Some(at) => verdicts.iter().rev().find(|v| v.at <= at + timeout_us).or(verdicts.last()),
        None => verdicts.last(),
    }
    .copied();
    let artifact = f.map_or("", |f| text(&f.fields.artifact_digest));
    let verdict_kind = verdict.map(|v| text(&v.fields.verdict));
    let digest_match =
        f.is_some() && verdict.is_some_and(|v| text(&v.fields.artifact_digest) == artifact) && !artifact.is_empty();
    let in_time = match (verdict, finished_at) {
        (Some(v), Some(at)) => seconds(v.at, at) <= timeout_s,
        _ => false,
    };
    let is_finished = f.is_some();
    let decided =
        is_finished && !env_failed && matches!(verdict_kind, Some("passed" | "failed")) && digest_match && in_time;
    let undecidable_reason = if is_finished && !env_failed && !decided {
        match verdict_kind {
            None => "no_verdict",
            Some("undecidable") => "verdict_undecidable",
            Some("error") => "verifier_error",
            Some(_) if !in_time => "verdict_late",
            Some(_) if !digest_match => "digest_mismatch",
            Some(_) => "unknown",
        }
    } else {
        ""
    };
    let started_on = s.and_then(|s| s.policy_version);
    let (oldest, newest) = match f {
        Some(f) => (f.fields.oldest_policy_version, f.fields.newest_policy_version),
        None => (started_on, started_on),
    };
    let (mut lag_versions, mut lag_seconds) = (None, None);
    if let (Some(f), Some(old)) = (f, oldest) {
        let published = timeline.times.partition_point(|t| *t <= f.at);
        let reference = if published > 0 {
            timeline.newest_so_far[published - 1]
        } else {
            f.fields.newest_policy_version.unwrap_or(0)
        };
        lag_versions = Some((reference - old).max(0));
        let newer = timeline.by_version.partition_point(|v| *v <= old);
        lag_seconds = Some(match timeline.earliest_from.get(newer) {
            Some(at) => seconds(f.at, *at).max(0.0),
            None => 0.0,
        });
    }
    let queued_at = queued.first().map(|e| e.at);
    let started_at = started.first().map(|e| e.at);
    let span = |later: Option<i64>, earlier: Option<i64>| Some(seconds(later?, earlier?));
    let termination = f.map_or("", |f| text(&f.fields.termination));
    let fv = verdict.map(|v| &v.fields);
    Some(Record {
        run_id: first.run_id.as_ref(),
        trajectory_id: text(&first.trajectory_id),
        domain,
        task_id: q.map_or("", |q| text(&q.task_id)),
        attempt: q.and_then(|q| q.attempt).unwrap_or(1),
        environment_version: q.map_or("", |q| text(&q.environment_version)),
        status: if f.is_some() {
            "finished"
        } else if s.is_some() {
            "running"
        } else {
            "queued"
        },
        sandbox_id: s.map_or("", |s| text(&s.sandbox_id)),
        policy_version: if s.is_some() { started_on } else { oldest },
        oldest,
        newest,
        queued_at,
        started_at,
        finished_at,
        wait_s: span(started_at, queued_at),
        run_s: span(finished_at, started_at),
        termination,
        steps: f.and_then(|f| f.fields.steps).unwrap_or(0),
        tokens: f.and_then(|f| f.fields.tokens).unwrap_or(0),
        artifact,
        env_failed,
        failure_class: main_failure.map_or("", |m| text(&m.failure_class)),
        failure_origin: main_failure.map_or("", |m| text(&m.origin)),
        failures: failures.len() as i64,
        model_error: failures.iter().any(|e| text(&e.fields.origin) == "model"),
        verdict: verdict_kind.unwrap_or(""),
        verifier_id: fv.map_or("", |v| text(&v.verifier_id)),
        verifier_version: fv.map_or("", |v| text(&v.verifier_version)),
        verified_digest: fv.map_or("", |v| text(&v.artifact_digest)),
        verdict_at: verdict.map(|v| v.at),
        reward: fv.and_then(|v| v.reward),
        digest_match,
        decided,
        passed: decided && verdict_kind == Some("passed"),
        undecidable_reason,
        claimed_complete: termination == "completed",
        lag_versions,
        lag_seconds,
        snapshots: snapshots.len() as i64,
        snapshot_bytes: snapshots.iter().map(|e| e.fields.bytes.unwrap_or(0)).sum(),
        resumes: resumes.len() as i64,
        resumes_succeeded: resumes.iter().filter(|e| e.fields.succeeded.unwrap_or(true)).count() as i64,
        steps_restored: resumes.iter().map(|e| e.fields.steps_restored.unwrap_or(0)).sum(),
        interruption_reasons: interrupts.iter().map(|e| text(&e.fields.reason)).collect(),
        revision: kept.len() as i64,
    })
}

/// The probe's settings: the cached-event classes, `TrajectoryRecord`, UTC, the verdict timeout, the run's timeline.
#[pyclass(frozen, module = "native_assembly_probe")]
struct Probe {
    classes: Vec<(usize, u8)>,
    record: Py<PyType>,
    utc: Py<PyTzInfo>,
    timeout_us: i64,
    timeout_s: f64,
    timeline: Timeline,
}

impl Probe {
    fn micros(&self, value: &Bound<'_, PyAny>) -> PyResult<i64> {
        let at = value.cast::<PyDateTime>().map_err(|_| PyValueError::new_err("occurred_at is not a datetime"))?;
        if at.get_tzinfo().is_none_or(|tz| tz.as_ptr() != self.utc.as_ptr()) {
            return Err(PyValueError::new_err("occurred_at is not in datetime.UTC"));
        }
        let day = days_from_civil(i64::from(at.get_year()), i64::from(at.get_month()), i64::from(at.get_day()));
        let second = i64::from(at.get_hour()) * 3600 + i64::from(at.get_minute()) * 60 + i64::from(at.get_second());
        Ok(day * DAY_US + second * 1_000_000 + i64::from(at.get_microsecond()))
    }

    /// The events' attributes that assembly reads, copied into native events.
    fn events_of(&self, events: &Bound<'_, PyAny>) -> PyResult<Vec<Event<PyBackedStr>>> {
        let py = events.py();
        let mut out = Vec::with_capacity(8);
        for item in events.try_iter()? {
            let e = item?;
            let ty = e.get_type().as_ptr() as usize;
            let kind = self.classes.iter().find(|(c, _)| *c == ty).map_or(OTHER, |(_, k)| *k);
            let get_str = |name: &Bound<'_, PyString>| -> PyResult<Option<PyBackedStr>> { e.getattr(name)?.extract() };
            let get_int = |name: &Bound<'_, PyString>| -> PyResult<Option<i64>> { e.getattr(name)?.extract() };
            let mut fields = Fields::new(e.getattr(intern!(py, "run_id"))?.extract()?);
            if kind != OTHER {
                // every trajectory event has both
                fields.trajectory_id = get_str(intern!(py, "trajectory_id"))?;
                fields.domain = get_str(intern!(py, "domain"))?;
            }
            match kind {
                QUEUED => {
                    fields.task_id = get_str(intern!(py, "task_id"))?;
                    fields.attempt = get_int(intern!(py, "attempt"))?;
                    fields.environment_version = get_str(intern!(py, "environment_version"))?;
                }
                STARTED => {
                    fields.policy_version = get_int(intern!(py, "policy_version"))?;
                    fields.sandbox_id = get_str(intern!(py, "sandbox_id"))?;
                }
                FINISHED => {
                    fields.termination = get_str(intern!(py, "termination"))?;
                    fields.steps = get_int(intern!(py, "steps"))?;
                    fields.tokens = get_int(intern!(py, "tokens"))?;
                    fields.artifact_digest = get_str(intern!(py, "artifact_digest"))?;
                    fields.oldest_policy_version = get_int(intern!(py, "oldest_policy_version"))?;
                    fields.newest_policy_version = get_int(intern!(py, "newest_policy_version"))?;
                }
                FAILED => {
                    fields.failure_class = get_str(intern!(py, "failure_class"))?;
                    fields.origin = get_str(intern!(py, "origin"))?;
                }
                VERDICT => {
                    fields.verifier_id = get_str(intern!(py, "verifier_id"))?;
                    fields.verifier_version = get_str(intern!(py, "verifier_version"))?;
                    fields.verdict = get_str(intern!(py, "verdict"))?;
                    fields.reward = e.getattr(intern!(py, "reward"))?.extract()?;
                    fields.artifact_digest = get_str(intern!(py, "artifact_digest"))?;
                }
                SNAPSHOT => fields.bytes = get_int(intern!(py, "bytes"))?,
                RESUMED => {
                    fields.succeeded = Some(e.getattr(intern!(py, "succeeded"))?.is_truthy()?);
                    fields.steps_restored = get_int(intern!(py, "steps_restored"))?;
                }
                INTERRUPTED => fields.reason = get_str(intern!(py, "reason"))?,
                _ => {}
            }
            out.push(Event {
                id: e.getattr(intern!(py, "event_id"))?.getattr(intern!(py, "int"))?.extract()?,
                at: self.micros(&e.getattr(intern!(py, "occurred_at"))?)?,
                kind,
                fields,
            });
        }
        Ok(out)
    }

    fn fold_of<'a, S: AsRef<str>>(&self, events: &'a [Event<S>]) -> Option<Record<'a>> {
        fold(events, &self.timeline, self.timeout_us, self.timeout_s)
    }

    fn time<'py>(&self, py: Python<'py>, micros: Option<i64>) -> PyResult<Bound<'py, PyAny>> {
        let Some(micros) = micros else { return Ok(py.None().into_bound(py)) };
        let (y, m, d) = civil_from_days(micros.div_euclid(DAY_US));
        let rest = micros.rem_euclid(DAY_US);
        let second = rest / 1_000_000;
        let at = PyDateTime::new(
            py,
            y,
            m,
            d,
            (second / 3600) as u8,
            (second / 60 % 60) as u8,
            (second % 60) as u8,
            (rest % 1_000_000) as u32,
            Some(self.utc.bind(py)),
        )?;
        Ok(at.into_any())
    }

    /// The record's values as Python objects, in field order.
    fn values_of<'py>(&self, py: Python<'py>, r: &Record<'_>) -> PyResult<Bound<'py, PyTuple>> {
        let s = |v: &str| PyString::new(py, v).into_any();
        let b = |v: bool| PyBool::new(py, v).to_owned().into_any();
        let i = |v: i64| -> PyResult<Bound<'py, PyAny>> { Ok(v.into_pyobject(py)?.into_any()) };
        let oi = |v: Option<i64>| -> PyResult<Bound<'py, PyAny>> {
            match v {
                Some(v) => i(v),
                None => Ok(py.None().into_bound(py)),
            }
        };
        let of = |v: Option<f64>| -> PyResult<Bound<'py, PyAny>> {
            match v {
                Some(v) => Ok(v.into_pyobject(py)?.into_any()),
                None => Ok(py.None().into_bound(py)),
            }
        };
        let values: [Bound<'py, PyAny>; 46] = [
            s(r.run_id),
            s(r.trajectory_id),
            s(r.domain),
            s(r.task_id),
            i(r.attempt)?,
            s(r.environment_version),
            s(r.status),
            s(r.sandbox_id),
            oi(r.policy_version)?,
            oi(r.oldest)?,
            oi(r.newest)?,
            self.time(py, r.queued_at)?,
            self.time(py, r.started_at)?,
            self.time(py, r.finished_at)?,
            of(r.wait_s)?,
            of(r.run_s)?,
            s(r.termination),
            i(r.steps)?,
            i(r.tokens)?,
            s(r.artifact),
            b(r.env_failed),
            s(r.failure_class),
            s(r.failure_origin),
            i(r.failures)?,
            b(r.model_error),
            s(r.verdict),
            s(r.verifier_id),
            s(r.verifier_version),
            s(r.verified_digest),
            self.time(py, r.verdict_at)?,
            of(r.reward)?,
            b(r.digest_match),
            b(r.decided),
            b(r.passed),
            s(r.undecidable_reason),
            b(r.claimed_complete),
            oi(r.lag_versions)?,
            of(r.lag_seconds)?,
            i(r.snapshots)?,
            i(r.snapshot_bytes)?,
            i(r.resumes)?,
            i(r.resumes_succeeded)?,
            i(r.steps_restored)?,
            i(r.interruptions())?,
            PyTuple::new(py, &r.interruption_reasons)?.into_any(),
            i(r.revision)?,
        ];
        PyTuple::new(py, values)
    }

    fn record<'py>(&self, py: Python<'py>, r: Option<Record<'_>>) -> PyResult<Bound<'py, PyAny>> {
        match r {
            Some(r) => self.record.bind(py).call1(self.values_of(py, &r)?),
            None => Ok(py.None().into_bound(py)),
        }
    }
}

impl Record<'_> {
    fn interruptions(&self) -> i64 {
        self.interruption_reasons.len() as i64
    }
}

#[pymethods]
impl Probe {
    /// `classes`: (class, kind) of every event class and cached-copy class assembly sorts (kinds: queued 0,
    /// started 1, finished 2, failed 3, verdict 4, snapshot 5, resumed 6, interrupted 7); `timeline`: the
    /// run's `VersionTimeline` as (times, newest so far, versions ascending, earliest from), times in
    /// microseconds since the epoch.
    #[new]
    fn new(
        classes: Vec<(Bound<'_, PyType>, u8)>,
        record: Py<PyType>,
        utc: Py<PyTzInfo>,
        timeout_us: i64,
        timeout_s: f64,
        timeline: (Vec<i64>, Vec<i64>, Vec<i64>, Vec<i64>),
    ) -> Self {
        let (times, newest_so_far, by_version, earliest_from) = timeline;
        Probe {
            classes: classes.iter().map(|(c, k)| (c.as_ptr() as usize, *k)).collect(),
            record,
            utc,
            timeout_us,
            timeout_s,
            timeline: Timeline { times, newest_so_far, by_version, earliest_from },
        }
    }

    /// How many events `assemble` would read (the reading alone).
    fn read(&self, events: &Bound<'_, PyAny>) -> PyResult<usize> {
        Ok(self.events_of(events)?.len())
    }

    /// The record's revision (reading and folding, no Python value built).
    fn fold(&self, events: &Bound<'_, PyAny>) -> PyResult<i64> {
        let events = self.events_of(events)?;
        Ok(self.fold_of(&events).map_or(0, |r| r.revision))
    }

    /// The record's values as a tuple (everything but the `TrajectoryRecord` itself).
    fn values<'py>(&self, py: Python<'py>, events: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let events = self.events_of(events)?;
        self.fold_of(&events).map(|r| self.values_of(py, &r)).transpose()
    }

    /// `assemble(events, timeline, config)` of the owner's cached events.
    fn assemble<'py>(&self, py: Python<'py>, events: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let events = self.events_of(events)?;
        self.record(py, self.fold_of(&events))
    }
}

fn parse_time(text: &str) -> Option<i64> {
    // The canonical form: YYYY-MM-DDTHH:MM:SS[.f{1,6}]Z
    let b = text.as_bytes();
    if b.len() < 20 || b[b.len() - 1] != b'Z' || b[10] != b'T' {
        return None;
    }
    let number = |from: usize, to: usize| -> Option<i64> { text.get(from..to)?.parse().ok() };
    let day = days_from_civil(number(0, 4)?, number(5, 7)?, number(8, 10)?);
    let second = number(11, 13)? * 3600 + number(14, 16)? * 60 + number(17, 19)?;
    let fraction = match b[19] {
        b'.' => {
            let digits = text.get(20..text.len() - 1)?;
            if digits.is_empty() || digits.len() > 6 {
                return None;
            }
            digits.parse::<i64>().ok()? * 10i64.pow(6 - digits.len() as u32)
        }
        b'Z' => 0,
        _ => return None,
    };
    Some(day * DAY_US + second * 1_000_000 + fraction)
}

/// A UUID's canonical text (8-4-4-4-12 hex digits) as its 128-bit value.
fn parse_uuid(text: &str) -> Option<u128> {
    if text.len() != 36 {
        return None;
    }
    let mut value: u128 = 0;
    for (i, c) in text.bytes().enumerate() {
        if matches!(i, 8 | 13 | 18 | 23) {
            if c != b'-' {
                return None;
            }
            continue;
        }
        value = value << 4 | u128::from((c as char).to_digit(16)?);
    }
    Some(value)
}

fn kind_of(event_type: &str) -> u8 {
    match event_type {
        "sandbox.rollout_queued" => QUEUED,
        "sandbox.rollout_started" => STARTED,
        "sandbox.rollout_finished" => FINISHED,
        "sandbox.environment_failed" => FAILED,
        "verifier.verification_finished" => VERDICT,
        "sandbox.snapshot_taken" => SNAPSHOT,
        "sandbox.resumed" => RESUMED,
        "sandbox.interrupted" => INTERRUPTED,
        _ => OTHER,
    }
}

/// Trajectory events parsed from canonical payloads and kept natively, by trajectory id.
#[pyclass(module = "native_assembly_probe")]
struct Store {
    trajectories: HashMap<String, Vec<Event<String>>>,
}

#[pymethods]
impl Store {
    #[new]
    fn new() -> Self {
        Store { trajectories: HashMap::new() }
    }

    /// Parse and keep canonical payloads (events without a trajectory are skipped); how many were kept.
    fn add(&mut self, payloads: Vec<PyBackedStr>) -> PyResult<usize> {
        let mut kept = 0;
        for payload in payloads {
            let fields: Fields<String> =
                serde_json::from_str(&payload).map_err(|e| PyValueError::new_err(e.to_string()))?;
            let Some(trajectory_id) = fields.trajectory_id.as_deref() else { continue };
            let new_key = (!self.trajectories.contains_key(trajectory_id)).then(|| trajectory_id.to_owned());
            let event_id = text(&fields.event_id);
            let id = parse_uuid(event_id).ok_or_else(|| PyValueError::new_err(format!("event_id {event_id:?}")))?;
            let at = parse_time(text(&fields.occurred_at)).ok_or_else(|| {
                PyValueError::new_err(format!("occurred_at {:?} is not canonical", fields.occurred_at))
            })?;
            let kind = kind_of(text(&fields.event_type));
            let event = Event {
                id,
                at,
                kind,
                fields: Fields { event_type: None, event_id: None, occurred_at: None, ..fields },
            };
            match new_key {
                Some(key) => {
                    self.trajectories.insert(key, vec![event]);
                }
                None => {
                    let key = event.fields.trajectory_id.as_deref().unwrap_or_default();
                    self.trajectories.get_mut(key).expect("a trajectory seen before").push(event);
                }
            }
            kept += 1;
        }
        Ok(kept)
    }

    /// The record's revision (folding only).
    fn fold(&self, probe: &Probe, trajectory_id: &str) -> i64 {
        self.trajectories.get(trajectory_id).and_then(|e| probe.fold_of(e)).map_or(0, |r| r.revision)
    }

    /// The record's values as a tuple (everything but the `TrajectoryRecord` itself).
    fn values<'py>(
        &self,
        py: Python<'py>,
        probe: &Probe,
        trajectory_id: &str,
    ) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let Some(events) = self.trajectories.get(trajectory_id) else { return Ok(None) };
        probe.fold_of(events).map(|r| probe.values_of(py, &r)).transpose()
    }

    /// The trajectory's `TrajectoryRecord`, from the events kept for it (None if there are none).
    fn assemble<'py>(&self, py: Python<'py>, probe: &Probe, trajectory_id: &str) -> PyResult<Bound<'py, PyAny>> {
        let Some(events) = self.trajectories.get(trajectory_id) else { return Ok(py.None().into_bound(py)) };
        probe.record(py, probe.fold_of(events))
    }
}

#[pymodule]
fn native_assembly_probe(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Probe>()?;
    m.add_class::<Store>()?;
    Ok(())
}
