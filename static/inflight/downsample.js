// Min/max/last downsampling on a power-of-two step grid (platform/inflight/live/downsample.py
// owns the grid; tests/platform/test_downsample.py runs this file under node against the
// Python oracle in tests/platform/downsample_oracle.py on the same input). Bucket: [min, max, lastStep, lastT, lastValue];
// "last" is the largest (step, t, value) triple.
(function (root, factory) {
  if (typeof module === "object" && module.exports) {
    module.exports = factory();
  } else {
    root.InflightDownsample = factory();
  }
})(typeof self !== "undefined" ? self : this, function () {
  "use strict";

  var MAX_BUCKETS = 1000;

  function shiftForMaxStep(maxStep) {
    if (maxStep === null || maxStep === undefined || maxStep < MAX_BUCKETS) return 0;
    var shift = 0;
    while (Math.floor(maxStep / Math.pow(2, shift)) >= MAX_BUCKETS) shift += 1;
    return shift;
  }

  function bucketIndex(step, shift) {
    // Math.floor of a division by a power of two == Python's arithmetic `step >> shift`.
    return Math.floor(step / Math.pow(2, shift));
  }

  function later(a, b) {
    if (a[2] !== b[2]) return a[2] > b[2];
    if (a[3] !== b[3]) return a[3] > b[3];
    return a[4] > b[4];
  }

  function mergeBuckets(a, b) {
    var last = later(a, b) ? a : b;
    return [Math.min(a[0], b[0]), Math.max(a[1], b[1]), last[2], last[3], last[4]];
  }

  function State(shift, maxStep, seq) {
    this.shift = shift || 0;
    this.maxStep = maxStep === undefined ? null : maxStep;
    this.seq = seq || 0;
    this.series = new Map(); // name -> Map(bucketIndex -> bucket)
  }

  State.fromSnapshot = function (snapshot) {
    var state = new State(snapshot.shift, snapshot.max_step, snapshot.seq);
    Object.keys(snapshot.series).forEach(function (name) {
      var c = snapshot.series[name];
      var buckets = new Map();
      for (var i = 0; i < c.b.length; i++) {
        buckets.set(c.b[i], [c.min[i], c.max[i], c.step[i], c.t[i], c.last[i]]);
      }
      state.series.set(name, buckets);
    });
    return state;
  };

  State.prototype.coarsenTo = function (shift) {
    while (this.shift < shift) {
      this.series.forEach(function (buckets, name, all) {
        var merged = new Map();
        buckets.forEach(function (bucket, index) {
          var parent = Math.floor(index / 2);
          merged.set(parent, merged.has(parent) ? mergeBuckets(merged.get(parent), bucket) : bucket);
        });
        all.set(name, merged);
      });
      this.shift += 1;
    }
  };

  State.prototype.addPoint = function (name, step, t, value) {
    if (this.maxStep === null || step > this.maxStep) {
      this.maxStep = step;
      this.coarsenTo(shiftForMaxStep(step));
    }
    if (!this.series.has(name)) this.series.set(name, new Map());
    var buckets = this.series.get(name);
    var index = bucketIndex(step, this.shift);
    var point = [value, value, step, t, value];
    buckets.set(index, buckets.has(index) ? mergeBuckets(buckets.get(index), point) : point);
  };

  // A push covers ingest batches from_seq..seq (from_seq defaults to seq). Returns "applied",
  // "stale" (seq already covered) or "gap" (a batch is missing: the caller refetches the snapshot).
  State.prototype.applyBatch = function (message) {
    var first = message.from_seq === undefined ? message.seq : message.from_seq;
    if (message.seq <= this.seq) return "stale";
    if (first > this.seq + 1) return "gap";
    for (var i = 0; i < message.points.length; i++) {
      var p = message.points[i];
      this.addPoint(p[0], p[1], p[2], p[3]);
    }
    this.seq = message.seq;
    return "applied";
  };

  // Bucket rows of one series in bucket order, as plotly-ready columns.
  State.prototype.columns = function (name) {
    var buckets = this.series.get(name);
    var out = { b: [], min: [], max: [], step: [], t: [], last: [] };
    if (!buckets) return out;
    var keys = Array.from(buckets.keys()).sort(function (x, y) { return x - y; });
    keys.forEach(function (k) {
      var bucket = buckets.get(k);
      out.b.push(k); out.min.push(bucket[0]); out.max.push(bucket[1]);
      out.step.push(bucket[2]); out.t.push(bucket[3]); out.last.push(bucket[4]);
    });
    return out;
  };

  State.prototype.toSnapshot = function () {
    var self = this;
    var names = Array.from(this.series.keys()).sort();
    var series = {};
    names.forEach(function (name) { series[name] = self.columns(name); });
    return { seq: this.seq, shift: this.shift, width: Math.pow(2, this.shift), max_step: this.maxStep, series: series };
  };

  // Exponential moving average over a series' last values (the smoothing slider).
  function ema(values, weight) {
    var out = [];
    var acc = null;
    for (var i = 0; i < values.length; i++) {
      acc = acc === null ? values[i] : acc * weight + values[i] * (1 - weight);
      out.push(acc);
    }
    return out;
  }

  return { MAX_BUCKETS: MAX_BUCKETS, shiftForMaxStep: shiftForMaxStep, mergeBuckets: mergeBuckets, State: State, ema: ema };
});
