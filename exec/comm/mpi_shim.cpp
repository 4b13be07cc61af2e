// libtwin_mpi_shim.so: MPI behind a C table (see mpi_shim.hpp for why). Built with the MPI compiler flags; loaded at
// run time by mpi_communicator.cpp.
//
// Every MPI function is called through a pointer that dlsym() found in the MPI library itself (located from the
// address of one of its data objects, MPI_COMM_WORLD, which SimGrid does not define): a call by name from here would
// be bound by the dynamic linker to the first definition in the process, SimGrid's. (RTLD_DEEPBIND would also isolate
// the names, but it breaks MPI when the executable brings its own malloc, as twin does with jemalloc.)
#include "exec/comm/mpi_shim.hpp"

#include <dlfcn.h>
#include <mpi.h>

#include <cstring>
#include <type_traits>

namespace {

MPI_Comm g_comm = MPI_COMM_NULL;
bool g_owns_mpi = false;
TwinMpiApi* g_api = nullptr;

// The MPI functions this shim uses, bound to the MPI library's own definitions.
struct Mpi {
  decltype(&MPI_Initialized) Initialized = nullptr;
  decltype(&MPI_Init_thread) Init_thread = nullptr;
  decltype(&MPI_Finalize) Finalize = nullptr;
  decltype(&MPI_Comm_dup) Comm_dup = nullptr;
  decltype(&MPI_Comm_free) Comm_free = nullptr;
  decltype(&MPI_Comm_set_errhandler) Comm_set_errhandler = nullptr;
  decltype(&MPI_Comm_rank) Comm_rank = nullptr;
  decltype(&MPI_Comm_size) Comm_size = nullptr;
  decltype(&MPI_Comm_get_attr) Comm_get_attr = nullptr;
  decltype(&MPI_Isend) Isend = nullptr;
  decltype(&MPI_Irecv) Irecv = nullptr;
  decltype(&MPI_Test) Test = nullptr;
  decltype(&MPI_Cancel) Cancel = nullptr;
  decltype(&MPI_Request_free) Request_free = nullptr;
  decltype(&MPI_Iprobe) Iprobe = nullptr;
  decltype(&MPI_Get_count) Get_count = nullptr;
  decltype(&MPI_Recv) Recv = nullptr;
  decltype(&MPI_Abort) Abort = nullptr;
  decltype(&MPI_Error_string) Error_string = nullptr;
};
Mpi mpi;

// Finds the MPI library (the object that holds MPI_COMM_WORLD; with MPI implementations whose handles are integers,
// the default lookup) and binds every function from it. Returns false if one is missing.
bool bind_mpi() {
  void* library = RTLD_DEFAULT;
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(MPI_COMM_WORLD), &info) != 0 && info.dli_fname != nullptr) {
    if (void* handle = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD)) library = handle;
  }
  bool complete = true;
  auto bind = [&](auto& pointer, const char* name) {
    pointer = reinterpret_cast<std::remove_reference_t<decltype(pointer)>>(dlsym(library, name));
    complete = complete && pointer != nullptr;
  };
  bind(mpi.Initialized, "MPI_Initialized");
  bind(mpi.Init_thread, "MPI_Init_thread");
  bind(mpi.Finalize, "MPI_Finalize");
  bind(mpi.Comm_dup, "MPI_Comm_dup");
  bind(mpi.Comm_free, "MPI_Comm_free");
  bind(mpi.Comm_set_errhandler, "MPI_Comm_set_errhandler");
  bind(mpi.Comm_rank, "MPI_Comm_rank");
  bind(mpi.Comm_size, "MPI_Comm_size");
  bind(mpi.Comm_get_attr, "MPI_Comm_get_attr");
  bind(mpi.Isend, "MPI_Isend");
  bind(mpi.Irecv, "MPI_Irecv");
  bind(mpi.Test, "MPI_Test");
  bind(mpi.Cancel, "MPI_Cancel");
  bind(mpi.Request_free, "MPI_Request_free");
  bind(mpi.Iprobe, "MPI_Iprobe");
  bind(mpi.Get_count, "MPI_Get_count");
  bind(mpi.Recv, "MPI_Recv");
  bind(mpi.Abort, "MPI_Abort");
  bind(mpi.Error_string, "MPI_Error_string");
  return complete;
}

int init(int* rank, int* size) {
  if (mpi.Init_thread == nullptr && !bind_mpi()) return MPI_ERR_OTHER;
  int initialized = 0;
  mpi.Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    const int code = mpi.Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    if (code != MPI_SUCCESS) return code;
    g_owns_mpi = true;
  }
  int code = mpi.Comm_dup(MPI_COMM_WORLD, &g_comm);
  if (code != MPI_SUCCESS) return code;
  mpi.Comm_set_errhandler(g_comm, MPI_ERRORS_RETURN);
  mpi.Comm_rank(g_comm, rank);
  mpi.Comm_size(g_comm, size);
  void* bound = nullptr;
  int flag = 0;
  mpi.Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &bound, &flag);
  if (flag && g_api != nullptr) g_api->tag_upper_bound = *static_cast<int*>(bound);
  return MPI_SUCCESS;
}

int finalize() {
  if (g_comm != MPI_COMM_NULL) mpi.Comm_free(&g_comm);
  return g_owns_mpi ? mpi.Finalize() : MPI_SUCCESS;
}

int isend(const void* data, int bytes, int peer, int tag, void** request) {
  auto* r = new MPI_Request(MPI_REQUEST_NULL);
  const int code = mpi.Isend(data, bytes, MPI_BYTE, peer, tag, g_comm, r);
  if (code != MPI_SUCCESS) {
    delete r;
    return code;
  }
  *request = r;
  return MPI_SUCCESS;
}

int irecv(void* data, int bytes, int peer, int tag, void** request) {
  auto* r = new MPI_Request(MPI_REQUEST_NULL);
  const int code = mpi.Irecv(data, bytes, MPI_BYTE, peer, tag, g_comm, r);
  if (code != MPI_SUCCESS) {
    delete r;
    return code;
  }
  *request = r;
  return MPI_SUCCESS;
}

int test(void** request, int* done) {
  auto* r = static_cast<MPI_Request*>(*request);
  if (r == nullptr) {
    *done = 1;
    return MPI_SUCCESS;
  }
  const int code = mpi.Test(r, done, MPI_STATUS_IGNORE);
  if (code == MPI_SUCCESS && *done) {
    delete r;
    *request = nullptr;
  }
  return code;
}

int cancel(void** request) {
  auto* r = static_cast<MPI_Request*>(*request);
  if (r == nullptr) return MPI_SUCCESS;
  mpi.Cancel(r);
  mpi.Request_free(r);
  delete r;
  *request = nullptr;
  return MPI_SUCCESS;
}

int iprobe(int peer, int tag, int* found, int* bytes) {
  MPI_Status status;
  const int code = mpi.Iprobe(peer, tag, g_comm, found, &status);
  if (code == MPI_SUCCESS && *found) mpi.Get_count(&status, MPI_BYTE, bytes);
  return code;
}

int recv(void* data, int bytes, int peer, int tag) {
  return mpi.Recv(data, bytes, MPI_BYTE, peer, tag, g_comm, MPI_STATUS_IGNORE);
}

void abort_job(int code) {
  mpi.Abort(MPI_COMM_WORLD, code);
}

void error_string(int code, char* text, int capacity) {
  char buffer[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (mpi.Error_string(code, buffer, &length) != MPI_SUCCESS) length = 0;
  const int n = length < capacity - 1 ? length : capacity - 1;
  std::memcpy(text, buffer, static_cast<std::size_t>(n));
  text[n] = '\0';
}

}  // namespace

extern "C" __attribute__((visibility("default"))) void twin_mpi_shim_api(TwinMpiApi* api) {
  g_api = api;
  api->init = init;
  api->finalize = finalize;
  api->isend = isend;
  api->irecv = irecv;
  api->test = test;
  api->cancel = cancel;
  api->iprobe = iprobe;
  api->recv = recv;
  api->abort = abort_job;
  api->error_string = error_string;
  api->tag_upper_bound = 32767;
}
