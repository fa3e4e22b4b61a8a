"""Real servers on loopback for the remote-data tests and benchmark:
nginx (Debian) serving a folder with range support, moto's S3 server, and a
fault-injecting HTTP proxy of our own (latency, a shared bandwidth cap,
resets, truncated bodies, error statuses, ignored ranges, changed objects,
corrupted bytes) that counts the requests it forwards."""
import collections
import http.client
import http.server
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port, proc=None, timeout=20.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError("server exited with %s" % proc.returncode)
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("nothing listens on port %d" % port)


def stop_process(proc):
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


NGINX = shutil.which("nginx") or "/usr/sbin/nginx"


class Nginx:
    """nginx serving `root` on 127.0.0.1 (static files: ETag, Range -> 206).
    With tls=True: HTTPS and HTTP/2 with a self-signed certificate for
    127.0.0.1 (`self.cert`, to trust through CURL_CA_BUNDLE); `requests()`
    reads the access log as (protocol, connection number, path, status)."""

    def __init__(self, root, tls=False):
        self.root = os.path.abspath(root)
        self.dir = tempfile.mkdtemp(prefix="stoker-nginx-")
        self.port = free_port()
        conf = os.path.join(self.dir, "nginx.conf")
        temp = os.path.join(self.dir, "tmp")
        os.makedirs(temp)
        user = "user root;\n" if os.geteuid() == 0 else ""
        listen = "127.0.0.1:%d" % self.port
        self.cert = None
        if tls:
            self.cert = os.path.join(self.dir, "cert.pem")
            key = os.path.join(self.dir, "key.pem")
            subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                            "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", key, "-out",
                            self.cert], check=True, capture_output=True)
            listen += " ssl http2; ssl_certificate %s; ssl_certificate_key %s" % (self.cert, key)
        with open(conf, "w") as f:
            f.write("""%sdaemon off;
master_process off;
worker_processes 1;
pid %s/nginx.pid;
error_log %s/error.log warn;
events { worker_connections 512; }
http {
  log_format stoker "$server_protocol $connection $uri $status";
  access_log %s/access.log stoker;
  sendfile on;
  client_body_temp_path %s/body; proxy_temp_path %s/proxy; fastcgi_temp_path %s/fcgi;
  uwsgi_temp_path %s/uwsgi; scgi_temp_path %s/scgi;
  types { application/x-tar tar; application/octet-stream stoker; }
  server { listen %s; root %s; location / { } }
}
""" % (user, self.dir, self.dir, self.dir, temp, temp, temp, temp, temp, listen, self.root))
        self.proc = subprocess.Popen([NGINX, "-c", conf, "-p", self.dir], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        wait_for_port(self.port, self.proc)
        self.url = "%s://127.0.0.1:%d" % ("https" if tls else "http", self.port)

    def requests(self):
        with open(os.path.join(self.dir, "access.log")) as f:
            return [tuple(line.split()) for line in f if line.strip()]

    def close(self):
        stop_process(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)


class MotoS3:
    """moto's S3-compatible server in its own process."""

    def __init__(self):
        self.port = free_port()
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_port(self.port, self.proc, timeout=60)
        self.url = "http://127.0.0.1:%d" % self.port

    def upload_folder(self, bucket, prefix, folder):
        import boto3
        import botocore.exceptions
        s3 = boto3.client("s3", endpoint_url=self.url, region_name="us-east-1", aws_access_key_id="test",
                          aws_secret_access_key="test")
        # The server may accept connections before it answers them (seen on a loaded machine: resets).
        deadline = time.time() + 30
        while True:
            try:
                s3.create_bucket(Bucket=bucket)
                break
            except botocore.exceptions.ConnectionError:
                if self.proc.poll() is not None or time.time() > deadline:
                    raise
                time.sleep(0.5)
        for name in sorted(os.listdir(folder)):
            s3.upload_file(os.path.join(folder, name), bucket, "%s/%s" % (prefix, name))

    def close(self):
        stop_process(self.proc)


class TokenBucket:
    """A bandwidth cap shared by every connection through the proxy."""

    def __init__(self, bytes_per_s):
        self.rate = bytes_per_s
        self.lock = threading.Lock()
        self.next_free = time.monotonic()

    def take(self, n):
        if not self.rate:
            return
        with self.lock:
            now = time.monotonic()
            start = max(now, self.next_free)
            self.next_free = start + n / self.rate
            delay = self.next_free - now
        if delay > 0:
            time.sleep(delay)


class FaultProxy:
    """Forwards GETs to `upstream` ("http://host:port"). Faults are queued per
    path suffix with `add_fault(suffix, kind, **args)`, each used once, first
    match first. Kinds: "status" (code=, retry_after=), "reset" (after=bytes),
    "truncate" (after=bytes, with the full Content-Length promised),
    "status" may carry location= (a redirect's Location header),
    "ignore_range" (answer 200 with the whole object), "change_etag",
    "corrupt" (flip one byte at offset=), "stall" (seconds=, then continue).
    `latency_s` delays every request; `bandwidth` caps all bodies together
    (bytes/s). `requests` counts forwarded requests by path; `headers` keeps
    the last request's headers by path."""

    def __init__(self, upstream, latency_s=0.0, bandwidth=0):
        self.upstream = upstream.replace("http://", "")
        self.latency_s = latency_s
        self.bucket = TokenBucket(bandwidth)
        self.faults = []
        self.lock = threading.Lock()
        self.requests = collections.Counter()
        self.headers = {}
        self.bytes_sent = 0
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                proxy.handle(self)

            def do_HEAD(self):
                proxy.handle(self)

        class Server(http.server.ThreadingHTTPServer):
            def handle_error(self, request, client_address):
                if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
                    super().handle_error(request, client_address)  # a client hanging up is no error

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = "http://127.0.0.1:%d" % self.port
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def add_fault(self, suffix, kind, **args):
        with self.lock:
            self.faults.append((suffix, kind, args))

    def _take_fault(self, path):
        with self.lock:
            for i, (suffix, kind, args) in enumerate(self.faults):
                if path.endswith(suffix):
                    del self.faults[i]
                    return kind, args
        return None, {}

    def handle(self, h):
        path = h.path
        with self.lock:
            self.requests[path] += 1
            self.headers[path] = dict(h.headers)
        if self.latency_s:
            time.sleep(self.latency_s)
        kind, args = self._take_fault(path)
        if kind == "status":
            body = b"injected fault"
            h.send_response(args.get("code", 503))
            if "retry_after" in args:
                h.send_header("Retry-After", str(args["retry_after"]))
            if "location" in args:
                h.send_header("Location", args["location"])
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            h.wfile.write(body)
            return
        headers = {k: v for k, v in h.headers.items() if k.lower() in ("range", "if-match", "authorization",
                                                                       "x-amz-date", "x-amz-content-sha256",
                                                                       "x-amz-security-token", "host")}
        if kind == "ignore_range":
            headers.pop("Range", None)
            headers.pop("range", None)
        conn = http.client.HTTPConnection(self.upstream, timeout=30)
        try:
            conn.request(h.command, path, headers=headers)
            resp = conn.getresponse()
            h.send_response(resp.status)
            length = None
            for k, v in resp.getheaders():
                lk = k.lower()
                if lk in ("connection", "transfer-encoding", "keep-alive"):
                    continue
                if lk == "etag" and kind == "change_etag":
                    v = '"changed-%d"' % time.time_ns()
                if lk == "content-length":
                    length = int(v)
                h.send_header(k, v)
            if length is None:
                data = resp.read()
                h.send_header("Content-Length", str(len(data)))
                h.end_headers()
                h.wfile.write(data)
                return
            h.end_headers()
            if h.command == "HEAD":
                return
            sent = 0
            cut = args.get("after") if kind in ("reset", "truncate") else None
            while sent < length:
                chunk = resp.read(min(1 << 16, length - sent))
                if not chunk:
                    break
                if kind == "corrupt":
                    at = args.get("offset", 0) - sent
                    if 0 <= at < len(chunk):
                        chunk = chunk[:at] + bytes([chunk[at] ^ 0xFF]) + chunk[at + 1:]
                if cut is not None and sent + len(chunk) >= cut:
                    chunk = chunk[:max(0, cut - sent)]
                    self.bucket.take(len(chunk))
                    h.wfile.write(chunk)
                    h.wfile.flush()
                    if kind == "reset":
                        h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    h.close_connection = True
                    h.connection.shutdown(socket.SHUT_RDWR)
                    return
                if kind == "stall" and sent == 0:
                    time.sleep(args.get("seconds", 1))
                self.bucket.take(len(chunk))
                h.wfile.write(chunk)
                sent += len(chunk)
                with self.lock:
                    self.bytes_sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            h.close_connection = True
        finally:
            conn.close()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


if __name__ == "__main__":
    # Serve a folder through nginx behind the proxy until interrupted:
    #   python3 remote_servers.py FOLDER [latency_ms] [MB/s]
    folder = sys.argv[1]
    nginx = Nginx(folder)
    proxy = FaultProxy(nginx.url, latency_s=float(sys.argv[2]) / 1000 if len(sys.argv) > 2 else 0,
                       bandwidth=float(sys.argv[3]) * 1e6 if len(sys.argv) > 3 else 0)
    print(proxy.url, flush=True)
    try:
        signal.pause()
    finally:
        proxy.close()
        nginx.close()
