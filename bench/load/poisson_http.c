/*
 * poisson-http: an open-loop HTTP/1.1 load generator (Poisson arrivals), the compiled counterpart of the Python open
 * loop (bench/load/offered.py) for the HTTP servers. bench/load/compiled.py builds and runs it; run it alone with
 * --help.
 *
 * Calls are due on a seeded Poisson schedule for --seconds. A due call goes out at once on an idle keep-alive
 * connection, or on a new one up to --max-connections; past that bound it is not sent (the generator's own refusal).
 * Each call is timed from its scheduled send, so a slow server cannot slow the load down (no coordinated omission),
 * and ends by --deadline-ms after its send. The request files (whole HTTP requests, as sent) are used in turn.
 *
 * Every answer's body is compared with the bodies seen before for the same request: the first few distinct ones are
 * written to --bodies (r<request>-v<variant>.body) for the caller to check against in-process ONNX Runtime, and each
 * call's line says which one it got, so that every answer is checked. One line per call goes to --out:
 *   request  scheduled_us  sent_us  done_us  status  variant
 * times from the schedule's start, status an HTTP status or one of the negative outcomes below, variant -1 when the
 * call had no body to compare (or more distinct bodies than are kept).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { NOT_SENT = -1, TIMED_OUT = -2, CONNECTION_ERROR = -3, BAD_ANSWER = -4 };
enum { IDLE, CONNECTING, SENDING, RECEIVING };
#define MAX_VARIANTS 4 /* distinct bodies kept per request: more means the server answers one input many ways */

typedef struct {
  char *data;
  size_t len;
} Bytes;

typedef struct {
  int64_t scheduled, sent, done; /* ns from the schedule's start; sent and done -1 until they happen */
  int request, status, variant;
} Call;

typedef struct {
  int fd, state, call;
  size_t written;
  char *in;
  size_t in_len, in_cap;
  int64_t deadline, idle_since;
} Connection;

static Bytes *requests;
static int request_count;
#define MAX_REQUESTS (1 << 12)
static Bytes variants[MAX_REQUESTS][MAX_VARIANTS];
static int variant_count[MAX_REQUESTS];
static const char *bodies_dir;
static Call *calls;
static Connection *connections;
static int *idle, idle_count, open_count, max_connections, in_flight;
static int epoll_fd;
static struct sockaddr_in address;
static int64_t start_ns, deadline_ns, idle_reuse_ns;

static int64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec - start_ns;
}

static void die(const char *what) {
  fprintf(stderr, "poisson-http: %s: %s\n", what, strerror(errno));
  exit(2);
}

static Bytes read_file(const char *path) {
  FILE *file = fopen(path, "rb");
  if (!file) die(path);
  Bytes bytes = {0};
  size_t cap = 0;
  char chunk[65536];
  size_t got;
  while ((got = fread(chunk, 1, sizeof chunk, file)) > 0) {
    if (bytes.len + got > cap) {
      cap = (bytes.len + got) * 2;
      bytes.data = realloc(bytes.data, cap);
      if (!bytes.data) die("memory");
    }
    memcpy(bytes.data + bytes.len, chunk, got);
    bytes.len += got;
  }
  fclose(file);
  return bytes;
}

/* splitmix64: a seeded stream of uniform doubles in [0, 1) for the exponential gaps */
static uint64_t seed_state;
static double uniform(void) {
  uint64_t z = (seed_state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  return (double)(z >> 11) / 9007199254740992.0;
}

static void watch(Connection *c, uint32_t events, int op) {
  struct epoll_event event = {.events = events, .data.u32 = (uint32_t)(c - connections)};
  if (epoll_ctl(epoll_fd, op, c->fd, &event) < 0) die("epoll_ctl");
}

static void close_connection(Connection *c) {
  epoll_ctl(epoll_fd, EPOLL_CTL_DEL, c->fd, NULL);
  close(c->fd);
  c->fd = -1;
  c->state = IDLE;
  c->in_len = 0;
  open_count--;
  for (int i = 0; i < idle_count; i++) /* an idle connection the server closed */
    if (&connections[idle[i]] == c) {
      idle[i] = idle[--idle_count];
      break;
    }
}

static void end_call(Connection *c, int status, int variant) {
  Call *call = &calls[c->call];
  call->done = now_ns();
  call->status = status;
  call->variant = variant;
  c->call = -1;
  in_flight--;
}

static void fail(Connection *c, int status) {
  if (c->call >= 0) end_call(c, status, -1);
  close_connection(c);
}

static void send_more(Connection *c) {
  Bytes *request = &requests[calls[c->call].request];
  while (c->written < request->len) {
    ssize_t n = send(c->fd, request->data + c->written, request->len - c->written, MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (c->state != SENDING) watch(c, EPOLLOUT, EPOLL_CTL_MOD);
      c->state = SENDING;
      return;
    }
    if (n <= 0) {
      fail(c, CONNECTION_ERROR);
      return;
    }
    c->written += (size_t)n;
  }
  if (c->state != RECEIVING) watch(c, EPOLLIN | EPOLLRDHUP, EPOLL_CTL_MOD);
  c->state = RECEIVING;
}

static int open_connection(void) {
  int index = -1;
  for (int i = 0; i < max_connections; i++)
    if (connections[i].fd < 0) {
      index = i;
      break;
    }
  Connection *c = &connections[index];
  c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (c->fd < 0) die("socket");
  int one = 1;
  setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  open_count++;
  c->state = CONNECTING;
  c->in_len = 0;
  watch(c, EPOLLOUT, EPOLL_CTL_ADD);
  if (connect(c->fd, (struct sockaddr *)&address, sizeof address) < 0 && errno != EINPROGRESS) {
    c->call = -1;
    close_connection(c);
    return -1;
  }
  return index;
}

static void dispatch(int index) {
  Call *call = &calls[index];
  call->sent = now_ns();
  /* The idle stack is last in, first out: when its top has been idle too long, so has every one below it. Servers
   * close idle connections, and one reused while its server closes it fails the call. */
  if (idle_count > 0 && call->sent - connections[idle[idle_count - 1]].idle_since > idle_reuse_ns)
    while (idle_count > 0) close_connection(&connections[idle[idle_count - 1]]);
  int slot = idle_count > 0 ? idle[--idle_count] : (open_count < max_connections ? open_connection() : -2);
  if (slot == -2) {
    call->sent = -1;
    call->status = NOT_SENT;
    return;
  }
  if (slot < 0) { /* connect() failed at once */
    call->done = call->sent;
    call->status = CONNECTION_ERROR;
    return;
  }
  in_flight++;
  Connection *c = &connections[slot];
  c->call = index;
  c->written = 0;
  c->in_len = 0;
  c->deadline = call->sent + deadline_ns;
  if (c->state == IDLE) send_more(c); /* else: connecting, sent once connected */
}

static int same_name(const char *line, const char *end, const char *name) {
  size_t n = strlen(name);
  return (size_t)(end - line) > n && strncasecmp(line, name, n) == 0;
}

/* The body's variant for the call's request: an earlier body equal to it, or a new one written to --bodies. */
static int variant_of(int request, const char *body, size_t len) {
  for (int v = 0; v < variant_count[request]; v++)
    if (variants[request][v].len == len && memcmp(variants[request][v].data, body, len) == 0) return v;
  if (variant_count[request] == MAX_VARIANTS) return -1;
  int v = variant_count[request]++;
  variants[request][v].data = malloc(len ? len : 1);
  if (!variants[request][v].data) die("memory");
  memcpy(variants[request][v].data, body, len);
  variants[request][v].len = len;
  char path[4096];
  snprintf(path, sizeof path, "%s/r%d-v%d.body", bodies_dir, request, v);
  FILE *file = fopen(path, "wb");
  if (!file || fwrite(body, 1, len, file) != len || fclose(file) != 0) die(path);
  return v;
}

/* A chunked body from `p`: its length once whole (decoded in place when `decode`), -1 while incomplete, -2 when
 * malformed. Checked whole first, then decoded, so that an incomplete body is left as it came. */
static long dechunk(char *p, char *end, int decode) {
  char *out = p, *at = p;
  for (;;) {
    char *line_end = memmem(at, (size_t)(end - at), "\r\n", 2);
    if (!line_end) return -1;
    char *digits_end;
    long size = strtol(at, &digits_end, 16);
    if (digits_end == at || size < 0) return -2;
    at = line_end + 2;
    if (size == 0) return end - at >= 2 ? out - p : -1; /* no trailers expected */
    if (end - at < size + 2) return -1;
    if (decode) memmove(out, at, (size_t)size);
    out += size;
    at += size + 2;
  }
}

/* A whole answer in c->in: end the call. Returns 0 while more bytes are needed. */
static int answer_complete(Connection *c) {
  char *head_end = memmem(c->in, c->in_len, "\r\n\r\n", 4);
  if (!head_end) return 0;
  int status = 0;
  if (sscanf(c->in, "HTTP/1.%*d %d", &status) != 1) {
    fail(c, BAD_ANSWER);
    return 1;
  }
  long length = -1;
  int chunked = 0, closing = 0;
  for (char *line = strstr(c->in, "\r\n") + 2; line < head_end; line = strstr(line, "\r\n") + 2) {
    char *end = strstr(line, "\r\n");
    if (same_name(line, end, "content-length:")) length = strtol(line + 15, NULL, 10);
    if (same_name(line, end, "transfer-encoding:") && memmem(line, (size_t)(end - line), "chunked", 7)) chunked = 1;
    if (same_name(line, end, "connection:") && memmem(line, (size_t)(end - line), "close", 5)) closing = 1;
  }
  char *body = head_end + 4, *end = c->in + c->in_len;
  if (chunked) {
    length = dechunk(body, end, 0);
    if (length == -1) return 0;
    if (length < 0) {
      fail(c, BAD_ANSWER);
      return 1;
    }
    dechunk(body, end, 1);
  } else if (length < 0) {
    fail(c, BAD_ANSWER); /* a body delimited by the connection's end: not what these servers send */
    return 1;
  } else if (end - body < length) {
    return 0;
  }
  end_call(c, status, variant_of(calls[c->call].request, body, (size_t)length));
  c->in_len = 0;
  if (closing) {
    close_connection(c);
  } else {
    c->state = IDLE;
    c->idle_since = now_ns();
    idle[idle_count++] = (int)(c - connections);
  }
  return 1;
}

static void receive(Connection *c) {
  for (;;) {
    if (c->in_cap - c->in_len < 65536) {
      c->in_cap = c->in_cap * 2 + 65536;
      c->in = realloc(c->in, c->in_cap + 1);
      if (!c->in) die("memory");
    }
    ssize_t n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) { /* closed or reset: by an idle connection's keep-alive timeout, or under a call */
      if (c->call >= 0)
        fail(c, CONNECTION_ERROR);
      else
        close_connection(c);
      return;
    }
    if (c->call < 0) { /* bytes nobody asked for */
      close_connection(c);
      return;
    }
    c->in_len += (size_t)n;
    c->in[c->in_len] = '\0';
    if (answer_complete(c)) return;
  }
}

static void on_event(Connection *c, uint32_t events) {
  if (c->fd < 0) return;
  if (c->state == CONNECTING) {
    int error = 0;
    socklen_t size = sizeof error;
    getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &error, &size);
    if (error || (events & (EPOLLERR | EPOLLHUP))) {
      fail(c, CONNECTION_ERROR);
      return;
    }
    c->state = SENDING;
    if (c->call >= 0) send_more(c);
    return;
  }
  if (c->state == SENDING) {
    if (events & (EPOLLERR | EPOLLHUP))
      fail(c, CONNECTION_ERROR);
    else
      send_more(c);
    return;
  }
  receive(c);
}

static void usage(FILE *to) {
  fprintf(to,
          "usage: poisson-http --port PORT --rate CALLS_PER_S --seconds S --out FILE --bodies DIR [options] "
          "REQUEST_FILE...\n"
          "  Offers CALLS_PER_S HTTP/1.1 calls a second (Poisson arrivals) to 127.0.0.1:PORT for S seconds, each\n"
          "  REQUEST_FILE (a whole request, as sent) in turn; one line per call to FILE:\n"
          "    request scheduled_us sent_us done_us status variant\n"
          "  status: HTTP status, -1 not sent (--max-connections busy), -2 past the deadline, -3 connection error,\n"
          "  -4 not an HTTP answer. Distinct answer bodies go to DIR/r<request>-v<variant>.body.\n"
          "options:\n"
          "  --host IPV4            default 127.0.0.1\n"
          "  --seed N               the schedule's seed; default 0\n"
          "  --max-connections N    calls in flight at most (one per connection); default 1024\n"
          "  --deadline-ms MS       each call's, from its send; default 2000\n"
          "  --idle-reuse-ms MS     an idle connection is reused only within this; default 1000 (servers close idle\n"
          "                         connections: gunicorn's keep-alive is 2 s)\n");
}

int main(int argc, char **argv) {
  const char *host = "127.0.0.1", *out_path = NULL;
  int port = 0;
  double rate = 0, seconds = 0, deadline_ms = 2000, idle_reuse_ms = 1000;
  max_connections = 1024;
  static struct option options[] = {
      {"host", required_argument, 0, 'h'},  {"port", required_argument, 0, 'p'},
      {"rate", required_argument, 0, 'r'},  {"seconds", required_argument, 0, 's'},
      {"seed", required_argument, 0, 'S'},  {"max-connections", required_argument, 0, 'c'},
      {"deadline-ms", required_argument, 0, 'd'}, {"out", required_argument, 0, 'o'},
      {"bodies", required_argument, 0, 'b'}, {"idle-reuse-ms", required_argument, 0, 'i'},
      {"help", no_argument, 0, 'H'},
      {0, 0, 0, 0}};
  int option;
  while ((option = getopt_long(argc, argv, "", options, NULL)) != -1) {
    switch (option) {
      case 'h': host = optarg; break;
      case 'p': port = atoi(optarg); break;
      case 'r': rate = atof(optarg); break;
      case 's': seconds = atof(optarg); break;
      case 'S': seed_state = strtoull(optarg, NULL, 10); break;
      case 'c': max_connections = atoi(optarg); break;
      case 'd': deadline_ms = atof(optarg); break;
      case 'o': out_path = optarg; break;
      case 'b': bodies_dir = optarg; break;
      case 'i': idle_reuse_ms = atof(optarg); break;
      case 'H': usage(stdout); return 0;
      default: usage(stderr); return 2;
    }
  }
  request_count = argc - optind;
  if (port <= 0 || rate <= 0 || seconds <= 0 || max_connections <= 0 || !out_path || !bodies_dir ||
      request_count < 1 || request_count > MAX_REQUESTS) {
    usage(stderr);
    return 2;
  }
  requests = calloc((size_t)request_count, sizeof *requests);
  for (int i = 0; i < request_count; i++) requests[i] = read_file(argv[optind + i]);
  address.sin_family = AF_INET;
  address.sin_port = htons((uint16_t)port);
  if (inet_pton(AF_INET, host, &address.sin_addr) != 1) {
    fprintf(stderr, "poisson-http: not an IPv4 address: %s\n", host);
    return 2;
  }
  struct rlimit files;
  getrlimit(RLIMIT_NOFILE, &files);
  if (files.rlim_cur < (rlim_t)max_connections + 64) {
    files.rlim_cur = files.rlim_max < (rlim_t)max_connections + 64 ? files.rlim_max : (rlim_t)max_connections + 64;
    setrlimit(RLIMIT_NOFILE, &files);
  }
  signal(SIGPIPE, SIG_IGN);

  /* The schedule: exponential gaps of mean 1/rate, the first call one gap after the start. */
  size_t cap = (size_t)(rate * seconds * 2) + 64, count = 0;
  calls = malloc(cap * sizeof *calls);
  double at = 0;
  for (;;) {
    at += -log(1.0 - uniform()) / rate;
    if (at >= seconds) break;
    if (count == cap) calls = realloc(calls, (cap *= 2) * sizeof *calls);
    calls[count] = (Call){(int64_t)(at * 1e9), -1, -1, (int)(count % (size_t)request_count), NOT_SENT, -1};
    count++;
  }
  connections = calloc((size_t)max_connections, sizeof *connections);
  idle = calloc((size_t)max_connections, sizeof *idle);
  for (int i = 0; i < max_connections; i++) connections[i] = (Connection){.fd = -1, .call = -1};
  epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd < 0) die("epoll_create1");
  deadline_ns = (int64_t)(deadline_ms * 1e6);
  idle_reuse_ns = (int64_t)(idle_reuse_ms * 1e6);

  start_ns = 0;
  start_ns = now_ns();
  size_t next = 0;
  struct epoll_event events[256];
  while (next < count || in_flight > 0) {
    int64_t now = now_ns();
    while (next < count && calls[next].scheduled <= now) dispatch((int)next++);
    int64_t wake = next < count ? calls[next].scheduled : now + 1000000;
    for (int i = 0; i < max_connections; i++) { /* deadlines: the nearest bounds the wait */
      Connection *c = &connections[i];
      if (c->fd < 0 || c->call < 0) continue;
      if (c->deadline <= now)
        fail(c, TIMED_OUT);
      else if (c->deadline < wake)
        wake = c->deadline;
    }
    int64_t wait = wake - now_ns();
    struct timespec timeout = {wait > 0 ? wait / 1000000000 : 0, wait > 0 ? wait % 1000000000 : 0};
    int n = epoll_pwait2(epoll_fd, events, 256, &timeout, NULL);
    if (n < 0 && errno != EINTR) die("epoll_pwait2");
    for (int i = 0; i < n; i++) on_event(&connections[events[i].data.u32], events[i].events);
  }

  FILE *out = fopen(out_path, "w");
  if (!out) die(out_path);
  for (size_t i = 0; i < count; i++) {
    Call *call = &calls[i];
    fprintf(out, "%d\t%lld\t%lld\t%lld\t%d\t%d\n", call->request, (long long)(call->scheduled / 1000),
            (long long)(call->sent < 0 ? -1 : call->sent / 1000), (long long)(call->done < 0 ? -1 : call->done / 1000),
            call->status, call->variant);
  }
  if (fclose(out) != 0) die(out_path);
  return 0;
}
