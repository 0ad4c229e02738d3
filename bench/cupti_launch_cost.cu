// What each CUPTI mechanism costs a launch-bound loop, measured in one process.
//
// Fresh processes of the same loop differ by up to 25% on the lent machines, more than the
// effects measured (docs/benchmarks.md), so here every mechanism is switched on and off again
// inside one process and the modes are interleaved over many rounds: each round runs every
// mode once, each mode's loop is N empty kernels then one cudaDeviceSynchronize.  The table
// gives each mode's median loop time over bare's in the same rounds, and the time the host
// took to issue the N launches (before the synchronize): where issue and loop are equal the
// loop is host-bound, where issue is shorter the GPU was behind.
//
// What it does not measure (H100, 2026-12-06): the kinds it enables after the context exists
// cost less here (kernel records 1.09-1.12x) than in fresh processes under `pastaprof run`
// (1.3-1.6x), but its bare loop is not a fresh process's either: after CUPTI's set-up and the
// first round, "bare" ran 3.84 us a launch against 3.06-3.67 us in a plain process, and each
// mode's ratio fell round by round (kernel records 1.35x in round 1, 0.82x in round 6).  Enabling
// launch calls as per-cbid activity records mid-process (k+rtact, k+act) made no record at all.
// So read it for differences between callback modes, and take the fresh-process numbers
// (scripts/gpu_native_check.py, bench/native_loop.py) for what a program pays.
//
//   nvcc -O2 -arch=sm_90 -o cupti_launch_cost bench/cupti_launch_cost.cu \
//        -I/usr/local/cuda/include -L/usr/local/cuda/lib64 -lcupti
//   ./cupti_launch_cost [N=50000] [ROUNDS=9] [MODES=all|comma list]
//
// Modes (k: CONCURRENT_KERNEL records; the callback does what the injection library's does:
// a clock read at ENTER, a row with a second clock read at EXIT):
//   bare, k, kserial (the KERNEL kind), k+rtcb (runtime launch callbacks), k+drvcb (driver
//   launch callbacks), k+cb (both), k+rtact / k+drvact / k+act (per-cbid API activity
//   records), k+domain (every runtime and driver callback), cb (callbacks, no records),
//   k+sync (the SYNCHRONIZATION kind), k+rtact+synccb (launch calls as activity records,
//   synchronizations by callbacks: the hybrid).
#include <cuda.h>
#include <cuda_runtime.h>
#include <cupti.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <time.h>
#include <vector>

__global__ void empty() {}

#define CK(call)                                                                     \
  do {                                                                               \
    CUptiResult r_ = (call);                                                         \
    if (r_ != CUPTI_SUCCESS) {                                                       \
      const char* s_ = "";                                                           \
      cuptiGetResultString(r_, &s_);                                                 \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, s_);              \
      exit(2);                                                                       \
    }                                                                                \
  } while (0)

static long long g_records[64];
static const size_t kBuf = 8 << 20;

static void CUPTIAPI requested(uint8_t** buf, size_t* size, size_t* max) {
  *buf = (uint8_t*)aligned_alloc(8, kBuf);
  *size = kBuf;
  *max = 0;
}

static void CUPTIAPI completed(CUcontext, uint32_t, uint8_t* buf, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  while (cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) g_records[rec->kind & 63]++;
  free(buf);
}

struct Row {
  long long start, end;
  unsigned corr, cbid;
};
static std::vector<Row> g_rows;
static thread_local int t_depth;
static long long g_callbacks;

static inline long long now_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void CUPTIAPI on_cb(void*, CUpti_CallbackDomain, CUpti_CallbackId cbid, const void* data) {
  const CUpti_CallbackData* d = (const CUpti_CallbackData*)data;
  g_callbacks++;
  if (d->callbackSite == CUPTI_API_ENTER) {
    *d->correlationData = t_depth++ ? 0 : (uint64_t)now_ns();
    return;
  }
  if (t_depth > 0) t_depth--;
  if (*d->correlationData == 0) return;
  g_rows.push_back(Row{(long long)*d->correlationData, now_ns(), d->correlationId, cbid});
}

static CUpti_SubscriberHandle g_sub;
static std::vector<CUpti_CallbackId> g_rt_launch, g_drv_launch, g_rt_sync, g_drv_sync;

static void find_cbids() {
  for (int drv = 0; drv < 2; ++drv) {
    int size = drv ? (int)CUPTI_DRIVER_TRACE_CBID_SIZE : (int)CUPTI_RUNTIME_TRACE_CBID_SIZE;
    for (int cbid = 1; cbid < size; ++cbid) {
      const char* name = nullptr;
      if (cuptiGetCallbackName(drv ? CUPTI_CB_DOMAIN_DRIVER_API : CUPTI_CB_DOMAIN_RUNTIME_API, cbid, &name) !=
              CUPTI_SUCCESS || !name)
        continue;
      if (strstr(name, "Launch")) (drv ? g_drv_launch : g_rt_launch).push_back(cbid);
      if (strstr(name, "Synchronize") || strstr(name, "StreamWaitEvent")) (drv ? g_drv_sync : g_rt_sync).push_back(cbid);
    }
  }
}

struct Mode {
  bool kernel = false, kserial = false, rtcb = false, drvcb = false, rtact = false, drvact = false, domain = false,
       sync = false, synccb = false;
};

static Mode parse(const std::string& name) {
  Mode m;
  if (name == "bare") return m;
  size_t pos = 0;
  std::string s = name + "+";
  while ((pos = s.find('+')) != std::string::npos) {
    std::string p = s.substr(0, pos);
    s.erase(0, pos + 1);
    if (p == "k") m.kernel = true;
    else if (p == "kserial") m.kserial = true;
    else if (p == "rtcb") m.rtcb = true;
    else if (p == "drvcb") m.drvcb = true;
    else if (p == "cb") m.rtcb = m.drvcb = true;
    else if (p == "rtact") m.rtact = true;
    else if (p == "drvact") m.drvact = true;
    else if (p == "act") m.rtact = m.drvact = true;
    else if (p == "domain") m.domain = true;
    else if (p == "sync") m.sync = true;
    else if (p == "synccb") m.synccb = true;
    else {
      fprintf(stderr, "unknown mode part %s\n", p.c_str());
      exit(2);
    }
  }
  return m;
}

static void set_cbs(const std::vector<CUpti_CallbackId>& ids, CUpti_CallbackDomain dom, int on) {
  for (auto id : ids) CK(cuptiEnableCallback(on, g_sub, dom, id));
}

static void apply(const Mode& m, int on) {
  if (m.kernel) CK(on ? cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)
                      : cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  if (m.kserial) CK(on ? cuptiActivityEnable(CUPTI_ACTIVITY_KIND_KERNEL) : cuptiActivityDisable(CUPTI_ACTIVITY_KIND_KERNEL));
  if (m.sync) CK(on ? cuptiActivityEnable(CUPTI_ACTIVITY_KIND_SYNCHRONIZATION)
                    : cuptiActivityDisable(CUPTI_ACTIVITY_KIND_SYNCHRONIZATION));
  if (m.rtcb) set_cbs(g_rt_launch, CUPTI_CB_DOMAIN_RUNTIME_API, on);
  if (m.drvcb) set_cbs(g_drv_launch, CUPTI_CB_DOMAIN_DRIVER_API, on);
  if (m.synccb) {
    set_cbs(g_rt_sync, CUPTI_CB_DOMAIN_RUNTIME_API, on);
    set_cbs(g_drv_sync, CUPTI_CB_DOMAIN_DRIVER_API, on);
  }
  if (m.domain) {
    CK(cuptiEnableDomain(on, g_sub, CUPTI_CB_DOMAIN_RUNTIME_API));
    CK(cuptiEnableDomain(on, g_sub, CUPTI_CB_DOMAIN_DRIVER_API));
  }
  if (m.rtact)
    for (auto id : g_rt_launch) CK(cuptiActivityEnableRuntimeApi(id, on));
  if (m.drvact)
    for (auto id : g_drv_launch) CK(cuptiActivityEnableDriverApi(id, on));
}

// seconds for n launches + synchronize; *issue: the launches alone
static double loop(int n, double* issue) {
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) empty<<<1, 1>>>();
  auto t1 = std::chrono::steady_clock::now();
  cudaDeviceSynchronize();
  auto t2 = std::chrono::steady_clock::now();
  *issue = std::chrono::duration<double>(t1 - t0).count();
  return std::chrono::duration<double>(t2 - t0).count();
}

int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 50000;
  int rounds = argc > 2 ? atoi(argv[2]) : 9;
  std::string list = argc > 3 ? argv[3] : "all";
  if (list == "all")
    list = "bare,k,kserial,k+rtcb,k+drvcb,k+cb,k+rtact,k+drvact,k+act,k+domain,cb,k+sync,k+rtact+synccb,k+cb+synccb";
  std::vector<std::string> names;
  for (size_t a = 0, b; a <= list.size(); a = b + 1) {
    b = list.find(',', a);
    if (b == std::string::npos) b = list.size();
    names.push_back(list.substr(a, b - a));
  }
  if (names.empty() || names[0] != "bare") names.insert(names.begin(), "bare");
  CK(cuptiActivityRegisterCallbacks(requested, completed));
  CK(cuptiSubscribe(&g_sub, on_cb, nullptr));
  find_cbids();
  g_rows.reserve((size_t)n * 4 + 16);
  empty<<<1, 1>>>();
  cudaDeviceSynchronize();
  double issue;
  loop(n, &issue);  // warm-up
  std::vector<std::vector<double>> t(names.size()), is(names.size());
  std::vector<long long> kernels(names.size()), api(names.size()), cbs(names.size());
  for (int r = 0; r < rounds; ++r) {
    for (size_t i = 0; i < names.size(); ++i) {
      Mode m = parse(names[i]);
      apply(m, 1);
      memset(g_records, 0, sizeof g_records);
      g_rows.clear();
      g_callbacks = 0;
      t[i].push_back(loop(n, &issue));
      is[i].push_back(issue);
      apply(m, 0);
      CK(cuptiActivityFlushAll(1));
      kernels[i] = g_records[CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL] + g_records[CUPTI_ACTIVITY_KIND_KERNEL];
      api[i] = g_records[CUPTI_ACTIVITY_KIND_RUNTIME] + g_records[CUPTI_ACTIVITY_KIND_DRIVER];
      cbs[i] = g_callbacks;
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  double bare = median(t[0]);
  printf("launch-bound loop in one process: %d empty kernels + sync, %d interleaved rounds, median\n", n, rounds);
  printf("%-20s %9s %7s %9s %9s %8s %8s %9s  %s\n", "mode", "loop s", "x bare", "us/launch", "issue us", "kernels",
         "api rec", "callbacks", "rounds (x bare)");
  for (size_t i = 0; i < names.size(); ++i) {
    double med = median(t[i]);
    printf("%-20s %9.5f %7.3f %9.3f %9.3f %8lld %8lld %9lld  ", names[i].c_str(), med, med / bare, med / n * 1e6,
           median(is[i]) / n * 1e6, kernels[i], api[i], cbs[i]);
    for (size_t r = 0; r < t[i].size(); ++r) printf("%s%.2f", r ? " " : "", t[i][r] / t[0][r]);
    printf("\n");
  }
  return 0;
}
