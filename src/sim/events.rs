//! Time-ordered event queue. Events fire in (time, priority, sequence) order, so events at the
//! same instant always fire in the same order (determinism), and time never goes back.

use crate::workload::RequestSpec;
use std::cmp::Ordering;
use std::collections::BinaryHeap;

#[derive(Debug, Clone)]
pub enum Event {
    /// A batch finished its pass through the model.
    StepDone { replica: u32, batch: u32 },
    /// The first pipeline stage can take another batch.
    StageFree { replica: u32 },
    /// A request reaches the router.
    Arrival { spec: RequestSpec, client: u32 },
    /// Try to start a step (lowest priority: runs after every same-time arrival and completion).
    Kick { replica: u32 },
}

impl Event {
    fn priority(&self) -> u8 {
        match self {
            Event::StepDone { .. } => 0,
            Event::StageFree { .. } => 1,
            Event::Arrival { .. } => 2,
            Event::Kick { .. } => 3,
        }
    }
}

struct Entry {
    time_us: f64,
    priority: u8,
    seq: u64,
    event: Event,
}

impl PartialEq for Entry {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Entry {
    fn cmp(&self, o: &Self) -> Ordering {
        // Reversed: BinaryHeap is a max-heap, we want the earliest first.
        o.time_us.total_cmp(&self.time_us).then(o.priority.cmp(&self.priority)).then(o.seq.cmp(&self.seq))
    }
}

#[derive(Default)]
pub struct EventQueue {
    heap: BinaryHeap<Entry>,
    seq: u64,
    now_us: f64,
}

impl EventQueue {
    pub fn now_us(&self) -> f64 {
        self.now_us
    }

    /// Schedules `event` at `time_us`, which must not be in the past.
    pub fn push(&mut self, time_us: f64, event: Event) {
        debug_assert!(time_us >= self.now_us, "event scheduled in the past: {time_us} < {}", self.now_us);
        let priority = event.priority();
        self.heap.push(Entry { time_us: time_us.max(self.now_us), priority, seq: self.seq, event });
        self.seq += 1;
    }

    /// The next event; advances the clock to its time.
    pub fn pop(&mut self) -> Option<(f64, Event)> {
        let e = self.heap.pop()?;
        assert!(e.time_us >= self.now_us, "simulated time went back: {} < {}", e.time_us, self.now_us);
        self.now_us = e.time_us;
        Some((e.time_us, e.event))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_time_events_fire_by_priority_then_insertion() {
        let mut q = EventQueue::default();
        q.push(5.0, Event::Kick { replica: 0 });
        q.push(5.0, Event::StepDone { replica: 1, batch: 0 });
        q.push(1.0, Event::Kick { replica: 2 });
        q.push(5.0, Event::StepDone { replica: 3, batch: 0 });
        let order: Vec<_> = std::iter::from_fn(|| q.pop())
            .map(|(t, e)| match e {
                Event::Kick { replica } | Event::StepDone { replica, .. } => (t, replica),
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(order, vec![(1.0, 2), (5.0, 1), (5.0, 3), (5.0, 0)]);
    }
}
