// A proxy-wasm host on V8, the Wasm engine Envoy runs by default, for
// kvroute's tests and benchmarks. The package doc (doc.go) says why it
// exists and what it models; this file is the host itself.
//
// Run by v8host.go as `node --no-liftoff host.mjs SPEC.json`: it starts an
// HTTP proxy with the module's filter ("filtered"), the same proxy without
// it ("plain") and an admin listener, prints their ports as one JSON line on
// stdout, and runs until its stdin closes.
import fs from 'node:fs';
import http from 'node:http';
import { WASI } from 'node:wasi';

const spec = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));

// proxy-wasm ABI 0.2.1 values.
const Status = { OK: 0, NotFound: 1, BadArgument: 2, CasMismatch: 8, Unimplemented: 12 };
const Action = { Continue: 0, Pause: 1 };
const MapType = { RequestHeaders: 0, ResponseHeaders: 2 };
const BufferType = { RequestBody: 0, ResponseBody: 1, VMConfiguration: 6, PluginConfiguration: 7 };

// Shared data is one store for every VM of the host, keyed as Envoy keys
// it (one vm_id here), with Envoy's CAS rule: a write with a non-zero CAS
// that is not the key's current one fails; a write to a new key succeeds.
const shared = new Map();
let nextCas = 1;
function casValue() {
  const c = nextCas;
  nextCas = (nextCas + 1) >>> 0 || 1;
  return c;
}

// stats is what the admin listener serves.
const stats = {
  callbackNs: 0, // time inside the VM's callbacks, host functions included
  callbacks: {}, // the same per callback name
  callbackCounts: {}, // calls per callback name
  hostCallNs: 0, hostCalls: 0, hostCallsByName: {}, // with spec.timeHostCalls only
  traps: 0,
  unknownProperties: [], // property paths the module asked for and the host does not serve
  logs: { debug: 0, info: 0, warn: 0, error: 0 },
  lastErrors: [], // the last 20 warnings, errors and traps
  metrics: {}, // by name: { type, value, samples }
};
const logLevels = ['trace', 'debug', 'info', 'warn', 'error', 'critical'];

// VM is one instance of the module with one root context (one plugin), as
// one Envoy worker holds it.
class VM {
  constructor(module, worker) {
    this.worker = worker;
    this.stream = null; // the stream whose callback is running
    this.rootConfig = null; // readable during on_configure only
    this.metrics = [];
    this.failed = false;
    const wasi = new WASI({ version: 'preview1', args: [], env: {}, returnOnExit: true });
    const wasiImports = { ...wasi.wasiImport };
    // Envoy answers poll_oneoff at once with no events: a VM never sleeps
    // on a worker thread (node's would block the event loop).
    wasiImports.poll_oneoff = (_in, _out, _n, neventsPtr) => {
      this.view().setUint32(neventsPtr, 0, true);
      return 0;
    };
    const env = this.hostFunctions();
    if (spec.timeHostCalls) timeEach(env);
    this.instance = new WebAssembly.Instance(module, { env, wasi_snapshot_preview1: wasiImports });
    this.ex = this.instance.exports;
    wasi.initialize(this.instance);
  }

  // mem is a Buffer over the module's memory, renewed when the memory grows
  // (growing detaches the old ArrayBuffer); view is a DataView over it.
  mem() {
    if (this.memBuffer !== this.ex.memory.buffer) {
      this.memBuffer = this.ex.memory.buffer;
      this.buf = Buffer.from(this.memBuffer);
      this.dv = new DataView(this.memBuffer);
    }
    return this.buf;
  }
  view() {
    this.mem();
    return this.dv;
  }
  // bytes reads module memory as a byte string (latin1: one character per
  // byte), the form node's HTTP parser gives header names and values in, so
  // keys, headers and values round-trip exactly; text reads UTF-8, for logs.
  bytes(ptr, len) { return this.mem().latin1Slice(ptr, ptr + len); }
  text(ptr, len) { return this.mem().toString('utf8', ptr, ptr + len); }
  copy(ptr, len) { return Buffer.from(this.mem().subarray(ptr, ptr + len)); }

  // alloc asks the module for n bytes, as Envoy does before every host
  // call that returns data, and stores their address and length at the
  // out-pointers. The host functions below write straight into it.
  alloc(n, ptrPtr, lenPtr) {
    const ptr = n > 0 ? this.ex.proxy_on_memory_allocate(n) : 0;
    const v = this.view();
    v.setUint32(ptrPtr, ptr, true);
    v.setUint32(lenPtr, n, true);
    return ptr;
  }

  // give hands bytes (a Buffer or Uint8Array) to the module.
  give(data, ptrPtr, lenPtr) {
    const ptr = this.alloc(data.length, ptrPtr, lenPtr);
    if (data.length > 0) this.mem().set(data, ptr);
    return Status.OK;
  }

  giveString(str, ptrPtr, lenPtr) {
    const n = str.length; // a byte string (see bytes)
    const ptr = this.alloc(n, ptrPtr, lenPtr);
    if (n > 0) this.mem().latin1Write(str, ptr, n);
    return Status.OK;
  }

  // givePairs serializes a header map as the ABI does, in place: a count,
  // every pair's key and value lengths, then each key and value
  // NUL-terminated.
  givePairs(pairs, ptrPtr, lenPtr) {
    const lens = new Array(pairs.length * 2);
    let size = 4 + 8 * pairs.length;
    for (let i = 0; i < pairs.length; i++) {
      lens[2 * i] = pairs[i][0].length;
      lens[2 * i + 1] = pairs[i][1].length;
      size += lens[2 * i] + lens[2 * i + 1] + 2;
    }
    const ptr = this.alloc(size, ptrPtr, lenPtr);
    const m = this.mem();
    const v = this.dv;
    v.setUint32(ptr, pairs.length, true);
    let o = ptr + 4;
    for (let i = 0; i < lens.length; i++, o += 4) v.setUint32(o, lens[i], true);
    for (let i = 0; i < pairs.length; i++) {
      o += m.latin1Write(pairs[i][0], o, lens[2 * i]);
      m[o++] = 0;
      o += m.latin1Write(pairs[i][1], o, lens[2 * i + 1]);
      m[o++] = 0;
    }
    return Status.OK;
  }

  // headerMap is the map a header call may touch now, or null (Envoy
  // answers BadArgument once a direction's headers have gone on).
  headerMap(type) {
    const s = this.stream;
    if (!s) return null;
    if (type === MapType.RequestHeaders && (s.reqMapLive || s.inLog)) return s.reqHeaders;
    if (type === MapType.ResponseHeaders && (s.respMapLive || s.inLog) && s.respHeaders) return s.respHeaders;
    return null;
  }

  property(path) {
    const s = this.stream;
    const header = (name) => {
      const h = s && this.headerMap(MapType.RequestHeaders);
      const e = h && h.find(([k]) => k === name);
      return e && e[1];
    };
    switch (path) {
      case 'plugin_root_id': case 'plugin_name': return spec.rootId;
      case 'plugin_vm_id': return spec.vmId;
      case 'route_name': return s && 'kvroute';
      case 'cluster_name': return s && s.upstream && 'engines';
      case 'upstream\0address': return s && s.upstream;
      case 'request\0path': return header(':path');
      case 'request\0method': return header(':method');
      case 'request\0host': return header(':authority');
      case 'request\0scheme': return header(':scheme');
      case 'request\0id': return header('x-request-id');
      case 'response\0code': return s && s.status != null ? le64(s.status) : undefined;
    }
    return undefined;
  }

  hostFunctions() {
    const vm = this;
    return {
      proxy_log(level, ptr, len) {
        const name = logLevels[level] || 'error';
        const key = name === 'critical' ? 'error' : name === 'trace' ? 'debug' : name;
        stats.logs[key]++;
        if (level >= 3) {
          const msg = vm.text(ptr, len);
          stats.lastErrors.push(msg);
          if (stats.lastErrors.length > 20) stats.lastErrors.shift();
          if (spec.verbose) console.error(`wasm ${name}: ${msg}`);
        }
        return Status.OK;
      },
      proxy_get_property(ptr, len, retPtr, retLen) {
        const path = vm.bytes(ptr, len);
        const v = vm.property(path);
        if (v === undefined) {
          const shown = path.replaceAll('\0', '.');
          if (!stats.unknownProperties.includes(shown)) stats.unknownProperties.push(shown);
          return Status.NotFound;
        }
        return typeof v === 'string' ? vm.giveString(v, retPtr, retLen) : vm.give(v, retPtr, retLen);
      },
      proxy_send_local_response(code, _dPtr, _dLen, bodyPtr, bodyLen, hdrPtr, hdrLen) {
        if (!vm.stream) return Status.BadArgument;
        vm.stream.local = { code, body: vm.copy(bodyPtr, bodyLen), headers: decodePairs(vm.copy(hdrPtr, hdrLen)) };
        return Status.OK;
      },
      proxy_get_shared_data(keyPtr, keyLen, retPtr, retLen, casPtr) {
        const e = shared.get(vm.bytes(keyPtr, keyLen));
        if (!e) return Status.NotFound;
        vm.give(e.value, retPtr, retLen);
        vm.view().setUint32(casPtr, e.cas, true);
        return Status.OK;
      },
      proxy_set_shared_data(keyPtr, keyLen, valPtr, valLen, cas) {
        const key = vm.bytes(keyPtr, keyLen);
        const e = shared.get(key);
        if (e && cas !== 0 && cas !== e.cas) return Status.CasMismatch;
        shared.set(key, { value: vm.copy(valPtr, valLen), cas: casValue() });
        return Status.OK;
      },
      proxy_get_header_map_value(type, keyPtr, keyLen, retPtr, retLen) {
        const h = vm.headerMap(type);
        if (!h) return Status.BadArgument;
        const key = vm.bytes(keyPtr, keyLen).toLowerCase();
        const e = h.find(([k]) => k === key);
        return e ? vm.giveString(e[1], retPtr, retLen) : Status.NotFound;
      },
      proxy_replace_header_map_value(type, keyPtr, keyLen, valPtr, valLen) {
        const h = vm.headerMap(type);
        if (!h || vm.stream.inLog) return Status.BadArgument;
        const key = vm.bytes(keyPtr, keyLen).toLowerCase();
        const val = vm.bytes(valPtr, valLen);
        const i = h.findIndex(([k]) => k === key);
        if (i < 0) h.push([key, val]);
        else {
          h[i] = [key, val];
          for (let j = h.length - 1; j > i; j--) if (h[j][0] === key) h.splice(j, 1);
        }
        return Status.OK;
      },
      proxy_remove_header_map_value(type, keyPtr, keyLen) {
        const h = vm.headerMap(type);
        if (!h || vm.stream.inLog) return Status.BadArgument;
        const key = vm.bytes(keyPtr, keyLen).toLowerCase();
        for (let j = h.length - 1; j >= 0; j--) if (h[j][0] === key) h.splice(j, 1);
        return Status.OK;
      },
      proxy_get_header_map_pairs(type, retPtr, retLen) {
        const h = vm.headerMap(type);
        return vm.givePairs(h || [], retPtr, retLen);
      },
      proxy_set_header_map_pairs(type, ptr, len) {
        const h = vm.headerMap(type);
        if (!h || vm.stream.inLog) return Status.BadArgument;
        h.splice(0, h.length, ...decodePairs(vm.copy(ptr, len)));
        return Status.OK;
      },
      proxy_get_buffer_bytes(type, start, max, retPtr, retLen) {
        let data;
        const s = vm.stream;
        if ((type === BufferType.RequestBody || type === BufferType.ResponseBody) && s) {
          const body = type === BufferType.RequestBody ? s.reqBuffer : s.respBuffer;
          const from = Math.min(start, body.length);
          const to = Math.min(body.length, from + max);
          const ptr = vm.alloc(to - from, retPtr, retLen);
          body.copyTo(vm.mem(), ptr, from, to);
          return Status.OK;
        }
        if (type === BufferType.VMConfiguration) data = Buffer.alloc(0);
        else if (type === BufferType.PluginConfiguration && vm.rootConfig) data = vm.rootConfig;
        if (!data) return Status.NotFound;
        return vm.give(data.subarray(Math.min(start, data.length), Math.min(data.length, start + max)), retPtr, retLen);
      },
      // A body write replaces [start, start+length) of the buffered body,
      // as Envoy does (ReplaceHttpRequestBody writes from 0 over all of it).
      proxy_set_buffer_bytes(type, start, length, dataPtr, dataLen) {
        const s = vm.stream;
        if (!s || (type !== BufferType.RequestBody && type !== BufferType.ResponseBody)) return Status.BadArgument;
        const key = type === BufferType.RequestBody ? 'reqBuffer' : 'respBuffer';
        const old = s[key];
        const whole = Buffer.alloc(old.length);
        old.copyTo(whole, 0, 0, old.length);
        const from = Math.min(start, whole.length);
        const to = Math.min(whole.length, from + length);
        const data = Buffer.from(vm.mem().subarray(dataPtr, dataPtr + dataLen));
        s[key] = new Chunks(whole.subarray(0, from), data, whole.subarray(to));
        return Status.OK;
      },
      proxy_continue_stream(type) {
        const s = vm.stream;
        if (!s) return Status.BadArgument;
        if (type === 0) s.resumeRequest = true;
        else s.resumeResponse = true;
        return Status.OK;
      },
      proxy_http_call() { return Status.Unimplemented; },
      proxy_set_tick_period_milliseconds(ms) { vm.tickMs = ms; return Status.OK; },
      proxy_set_effective_context() { return Status.OK; },
      proxy_define_metric(type, namePtr, nameLen, idPtr) {
        const name = vm.bytes(namePtr, nameLen);
        if (!stats.metrics[name]) stats.metrics[name] = { type, value: 0, samples: [] };
        vm.metrics.push(stats.metrics[name]);
        vm.view().setUint32(idPtr, vm.metrics.length - 1, true);
        return Status.OK;
      },
      proxy_increment_metric(id, offset) {
        const m = vm.metrics[id];
        if (!m) return Status.NotFound;
        m.value += Number(offset);
        return Status.OK;
      },
      proxy_record_metric(id, value) {
        const m = vm.metrics[id];
        if (!m) return Status.NotFound;
        if (m.type === 2) {
          if (m.samples.length >= 100000) m.samples.shift();
          m.samples.push(Number(value));
        } else m.value = Number(value);
        return Status.OK;
      },
    };
  }

  // call runs one callback, timed; a stream's callbacks stop once its
  // context is deleted (a client reset). A trap (an unrecovered Go panic
  // ends in proc_exit) fails the VM, as it does in Envoy.
  call(name, stream, ...args) {
    if (this.failed || (stream && stream.deleted)) return Action.Continue;
    this.stream = stream;
    const t0 = process.hrtime.bigint();
    try {
      return this.ex['proxy_on_' + name](...args);
    } catch (err) {
      this.failed = true;
      stats.traps++;
      stats.lastErrors.push(`trap in proxy_on_${name}: ${err && err.message}`);
      return Action.Continue;
    } finally {
      const d = Number(process.hrtime.bigint() - t0);
      stats.callbackNs += d;
      stats.callbacks[name] = (stats.callbacks[name] || 0) + d;
      stats.callbackCounts[name] = (stats.callbackCounts[name] || 0) + 1;
      this.stream = null;
    }
  }

  start() {
    const config = Buffer.from(spec.configuration);
    this.call('context_create', null, 1, 0);
    this.call('vm_start', null, 1, 0);
    this.rootConfig = config;
    const ok = this.call('configure', null, 1, config.length);
    this.rootConfig = null;
    if (!ok || this.failed) throw new Error(`plugin ${spec.rootId} failed to start: ${stats.lastErrors.join('; ')}`);
    if (this.tickMs) setInterval(() => this.call('tick', null, 1), this.tickMs).unref();
  }
}

// timeEach wraps every host function to add its time to stats.hostCallNs
// (Config.TimeHostCalls: it costs two clock reads per call).
function timeEach(fns) {
  for (const [name, fn] of Object.entries(fns)) {
    fns[name] = (...args) => {
      const t0 = process.hrtime.bigint();
      try {
        return fn(...args);
      } finally {
        const d = Number(process.hrtime.bigint() - t0);
        stats.hostCallNs += d;
        stats.hostCalls++;
        const by = stats.hostCallsByName[name] || (stats.hostCallsByName[name] = { ns: 0, calls: 0 });
        by.ns += d;
        by.calls++;
      }
    };
  }
}

function le64(n) {
  const b = new Uint8Array(8);
  new DataView(b.buffer).setBigUint64(0, BigInt(n), true);
  return b;
}

function decodePairs(b) {
  if (b.length < 4) return [];
  const view = new DataView(b.buffer, b.byteOffset, b.byteLength);
  const n = view.getUint32(0, true);
  const lens = [];
  let o = 4;
  for (let i = 0; i < n; i++, o += 8) lens.push([view.getUint32(o, true), view.getUint32(o + 4, true)]);
  const pairs = [];
  for (const [kl, vl] of lens) {
    const k = b.latin1Slice(o, o + kl);
    o += kl + 1;
    const v = b.latin1Slice(o, o + vl);
    o += vl + 1;
    pairs.push([k, v]);
  }
  return pairs;
}

// Chunks is a body buffer as Envoy keeps one: the chunks as they arrived,
// copied only when the filter reads them (get_buffer_bytes).
class Chunks {
  constructor(...parts) {
    this.parts = parts;
    this.length = parts.reduce((n, p) => n + p.length, 0);
  }
  push(chunk) {
    this.parts.push(chunk);
    this.length += chunk.length;
  }
  // copyTo writes bytes [start, end) into dst at offset.
  copyTo(dst, offset, start, end) {
    let pos = 0;
    for (const p of this.parts) {
      const a = Math.max(start, pos);
      const b = Math.min(end, pos + p.length);
      if (a < b) {
        dst.set(p.subarray(a - pos, b - pos), offset);
        offset += b - a;
      }
      pos += p.length;
      if (pos >= end) break;
    }
  }
  writeTo(stream) {
    for (const p of this.parts) stream.write(p);
  }
}

const module = new WebAssembly.Module(fs.readFileSync(spec.module));
const vms = [];
for (let i = 0; i < (spec.workers || 1); i++) {
  const vm = new VM(module, i);
  vm.start();
  vms.push(vm);
}
const upstreamAgent = new http.Agent({ keepAlive: true, maxSockets: 256 });
let nextWorker = 0;
let nextStream = 2;
let roundRobin = 0;

// plain forwards a request to the upstreams in turn, streaming both bodies:
// the host without the filter.
function plain(req, res) {
  const [host, port] = spec.upstreams[roundRobin++ % spec.upstreams.length].split(':');
  const up = http.request({ host, port, method: req.method, path: req.url, headers: req.headers, agent: upstreamAgent }, (ur) => {
    res.writeHead(ur.statusCode, ur.headers);
    ur.pipe(res);
  });
  up.on('error', () => { if (!res.headersSent) res.writeHead(503); res.end(); });
  req.pipe(up);
}

// filtered runs one stream through the filter as Envoy's HTTP connection
// manager does: headers, then the body chunk by chunk (held while the filter
// pauses), the destination header chosen, the upstream response through the
// response callbacks, then on_log, on_done and on_delete.
function filtered(req, res) {
  const sock = req.socket;
  if (sock.kvWorker === undefined) sock.kvWorker = nextWorker++ % vms.length; // a connection stays on one worker
  const vm = vms[sock.kvWorker];
  if (vm.failed) {
    res.writeHead(503);
    res.end('wasm VM failed');
    return;
  }
  const reqHeaders = [[':method', req.method], [':path', req.url], [':authority', req.headers.host || ''], [':scheme', 'http']];
  for (let i = 0; i < req.rawHeaders.length; i += 2) {
    const k = req.rawHeaders[i].toLowerCase();
    if (k !== 'host') reqHeaders.push([k, req.rawHeaders[i + 1]]);
  }
  const s = {
    id: nextStream++, reqHeaders, respHeaders: null, reqMapLive: true, respMapLive: false, inLog: false,
    reqBuffer: new Chunks(), respBuffer: new Chunks(), upstream: null, status: null, local: null, ended: false,
  };
  let upReq = null; // the upstream request once the headers went on
  const finish = () => {
    if (s.ended) return;
    s.ended = true;
    s.inLog = true;
    vm.call('log', s, s.id);
    s.inLog = false;
    vm.call('done', s, s.id);
    vm.call('delete', s, s.id);
    s.deleted = true;
  };
  const reply = ({ code, body, headers }) => {
    if (res.headersSent) { res.destroy(); return; }
    const h = {};
    for (const [k, v] of headers || []) h[k] = v;
    res.writeHead(code, h);
    res.end(body);
  };
  res.on('close', () => {
    if (!res.writableFinished && upReq) upReq.destroy(); // a client reset
    finish();
  });
  const local = () => {
    if (!s.local) return false;
    if (upReq) upReq.destroy();
    req.resume();
    reply(s.local);
    return true;
  };
  const route = () => {
    const dest = (reqHeaders.find(([k]) => k === spec.destinationHeader) || [])[1];
    const target = dest ? dest.split(',')[0].trim() : spec.upstreams[roundRobin++ % spec.upstreams.length];
    const i = target.lastIndexOf(':');
    const headers = {};
    for (const [k, v] of reqHeaders) if (k[0] !== ':') headers[k] = v;
    upReq = http.request({ host: target.slice(0, i), port: target.slice(i + 1), method: req.method, path: req.url, headers, agent: upstreamAgent }, (ur) => respond(ur, target));
    upReq.on('error', () => reply({ code: 503, body: 'upstream connect error' }));
  };

  vm.stream = s;
  vm.call('context_create', s, s.id, 1);
  const hasBody = req.headers['content-length'] !== '0' && (req.headers['content-length'] || req.headers['transfer-encoding']);
  let paused = vm.call('request_headers', s, s.id, reqHeaders.length, hasBody ? 0 : 1) !== Action.Continue;
  if (local()) return;
  if (!paused) {
    s.reqMapLive = false;
    route();
  }
  let size = 0;
  req.on('data', (chunk) => {
    if (s.local) return;
    size += chunk.length;
    if (paused) {
      s.reqBuffer.push(chunk);
      paused = vm.call('request_body', s, s.id, s.reqBuffer.length, 0) !== Action.Continue && !s.resumeRequest;
      if (local()) return;
      if (!paused) {
        route();
        s.reqBuffer.writeTo(upReq);
      }
      return;
    }
    // After the headers went on, a body callback that does not continue
    // buffers (Envoy's StopIterationAndBuffer): the chunks so far are handed
    // to it again with the next one, and go upstream, as the filter left
    // them, when it continues.
    if (s.bodyHeld) s.reqBuffer.push(chunk);
    else s.reqBuffer = new Chunks(chunk);
    const cont = vm.call('request_body', s, s.id, s.reqBuffer.length, 0) === Action.Continue;
    if (local()) return;
    s.bodyHeld = !cont;
    if (cont) s.reqBuffer.writeTo(upReq);
  });
  req.on('end', () => {
    if (s.local) return;
    if (paused) {
      if (hasBody) {
        paused = vm.call('request_body', s, s.id, s.reqBuffer.length, 1) !== Action.Continue && !s.resumeRequest;
        if (local()) return;
      } else paused = false;
      if (paused) { reply({ code: 500, body: 'filter paused the request at its end and never resumed it' }); return; }
      route();
      s.reqBuffer.writeTo(upReq);
      upReq.end();
      return;
    }
    if (hasBody) {
      if (!s.bodyHeld) s.reqBuffer = new Chunks();
      const cont = vm.call('request_body', s, s.id, s.reqBuffer.length, 1) === Action.Continue || s.resumeRequest;
      if (local()) return;
      if (!cont) { reply({ code: 500, body: 'filter paused the request at its end and never resumed it' }); return; }
      if (s.bodyHeld) s.reqBuffer.writeTo(upReq);
    }
    upReq.end();
  });

  function respond(ur, target) {
    s.upstream = target;
    s.status = ur.statusCode;
    s.respHeaders = [[':status', String(ur.statusCode)]];
    for (let i = 0; i < ur.rawHeaders.length; i += 2) s.respHeaders.push([ur.rawHeaders[i].toLowerCase(), ur.rawHeaders[i + 1]]);
    s.respMapLive = true;
    let rpaused = vm.call('response_headers', s, s.id, s.respHeaders.length, 0) !== Action.Continue;
    if (local()) return;
    const writeHead = () => {
      const h = {};
      for (const [k, v] of s.respHeaders) if (k[0] !== ':') h[k] = v;
      delete h['content-length']; // the filter may have changed the body's framing
      res.writeHead(ur.statusCode, h);
    };
    if (!rpaused) {
      s.respMapLive = false;
      writeHead();
    }
    ur.on('data', (chunk) => {
      if (s.local) return;
      if (rpaused) {
        s.respBuffer.push(chunk);
        rpaused = vm.call('response_body', s, s.id, s.respBuffer.length, 0) !== Action.Continue;
        if (local()) return;
        if (!rpaused) {
          writeHead();
          s.respBuffer.writeTo(res);
        }
        return;
      }
      s.respBuffer = new Chunks(chunk);
      vm.call('response_body', s, s.id, chunk.length, 0);
      if (local()) return;
      res.write(chunk);
    });
    ur.on('end', () => {
      if (s.local) return;
      if (!rpaused) s.respBuffer = new Chunks();
      vm.call('response_body', s, s.id, s.respBuffer.length, 1);
      if (local()) return;
      if (rpaused) {
        writeHead();
        s.respBuffer.writeTo(res);
      }
      res.end();
    });
  }
}

function admin(req, res) {
  const url = new URL(req.url, 'http://admin');
  if (url.pathname === '/shared') {
    // One shared-data key, as a test reads the index the VMs share.
    const e = shared.get(url.searchParams.get('key') || '');
    res.writeHead(e ? 200 : 404, { 'content-type': 'application/json' });
    res.end(e ? JSON.stringify({ value: Buffer.from(e.value).toString('base64'), cas: e.cas }) : '{}');
    return;
  }
  const cpu = process.cpuUsage();
  const body = { ...stats, cpuUs: cpu.user + cpu.system, failedVMs: vms.filter((v) => v.failed).length };
  const withSamples = req.url.includes('samples');
  body.metrics = {};
  for (const [k, m] of Object.entries(stats.metrics)) {
    body.metrics[k] = { type: m.type, value: m.value, count: m.samples.length, samples: withSamples ? m.samples : undefined };
  }
  res.writeHead(200, { 'content-type': 'application/json' });
  res.end(JSON.stringify(body));
}

async function listen(handler) {
  const srv = http.createServer(handler);
  srv.keepAliveTimeout = 60000;
  await new Promise((resolve) => srv.listen(0, '127.0.0.1', resolve));
  return srv.address().port;
}

const ports = { filtered: await listen(filtered), plain: await listen(plain), admin: await listen(admin), node: process.version };
process.stdout.write(JSON.stringify(ports) + '\n');
process.stdin.on('end', () => process.exit(0));
process.stdin.on('close', () => process.exit(0));
process.stdin.resume();
