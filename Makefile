# Tandem: speculative-decoding inference engine for DeepSeek-V4-class models.
#   make            build bin/tandem (CUDA sources too when nvcc is found)
#   make test       CPU tests, then the unit tests again under ASan + UBSan
#   make test-cpu   CPU tests only (no sanitizers)
#   make format     clang-format every C/CUDA source
#   make SANITIZER=address,undefined ...   sanitized build in build-san/
#   make DEBUG=1 ...  debug build in build-debug/: -O0 -g, nvcc -G, device assertions
#                     (TD_DEV_ASSERT), synchronous launches (TD_SYNC=1 unless set otherwise)
MAKEFLAGS += -r -j$(shell nproc)
CC      ?= cc
NVCC    ?= nvcc
CUARCH  ?= sm_90a
# DEPS=DIR: Debian packages unpacked under DIR (dpkg -x), for machines without them installed
ifneq ($(DEPS),)
DEPS_INC := -I$(DEPS)/usr/include -I$(DEPS)/usr/include/x86_64-linux-gnu
DEPS_LIB := -L$(DEPS)/usr/lib/x86_64-linux-gnu -Wl,-rpath,$(abspath $(DEPS))/usr/lib/x86_64-linux-gnu
endif
BUILD   ?= build
CFLAGS  ?= -O2 -g
CFLAGS  += -std=c11 -Wall -Wextra -Werror -D_DEFAULT_SOURCE -I. -MMD -MP $(DEPS_INC)
LDLIBS  += -lmicrohttpd -linih -ljansson -lpcre2-8 -lutf8proc -lxxhash -lm -lpthread
LDFLAGS += $(DEPS_LIB)

ifneq ($(DEBUG),)
BUILD   := build-debug
CFLAGS  := -O0 -g $(filter-out -O%,$(CFLAGS)) -DTD_DEBUG
endif

ifneq ($(SANITIZER),)
BUILD   := build-san
CFLAGS  += -fsanitize=$(SANITIZER) -fno-omit-frame-pointer -fno-sanitize-recover=all
LDFLAGS += -fsanitize=$(SANITIZER)
endif

# CUDA: nvcc must be on PATH and its runtime libraries must link. nvcc names its own
# library directories (-dryrun), so a wrapper script in /usr/local/bin works too.
COMMA := ,
HAVE_NVCC := $(shell command -v $(NVCC) 2>/dev/null)
CU_SRC :=
ifeq ($(HAVE_NVCC),)
$(info ✗ nvcc not found, building CPU-only)
else
CUDA_LIBDIRS := $(shell $(NVCC) -dryrun -x cu /dev/null -o /dev/null 2>&1 | sed -n 's/^\#\$$ LIBRARIES= *//p' | tr -d '"')
CUDA_LIBDIR  := $(filter-out %/stubs,$(CUDA_LIBDIRS))
CUDA_LDLIBS  := $(CUDA_LIBDIR) $(patsubst -L%,-Wl$(COMMA)-rpath$(COMMA)%,$(CUDA_LIBDIR)) -lcudart -lcublasLt -lstdc++
CUDA_LINKS   := $(shell printf 'int main(void){return 0;}' | $(CC) -x c - -o /dev/null $(CUDA_LDLIBS) 2>/dev/null && echo yes)
ifneq ($(CUDA_LINKS),yes)
$(info ✗ nvcc found but libcudart/libcublasLt do not link (nvcc's dirs: $(or $(CUDA_LIBDIRS),none)), building CPU-only)
else
CU_SRC := $(wildcard kernels/*.cu model/*.cu)
NVFLAGS := -std=c++17 -g -MMD -MP -gencode=arch=compute_$(subst sm_,,$(CUARCH)),code=$(CUARCH) -I. $(DEPS_INC)
NVFLAGS += -Xcompiler -Wall,-Wextra,-Werror
ifneq ($(DEBUG),)
NVFLAGS += -O0 -G -DTD_DEBUG
else
NVFLAGS += -O3 -lineinfo
endif
ifneq ($(CU_SRC),)
LDLIBS  += $(CUDA_LDLIBS)
CFLAGS  += -DTD_HAVE_CUDA=1
# NCCL (--gpus N): nccl.h and libnccl.so.2 from NVIDIA's wheel (pip's nvidia-nccl-cu13, which
# torch installs too) or beside the toolkit, found by NCCL_HOME=DIR, python3's nvidia.nccl
# package, or nvcc's TOP
NCCL_TRY  := $(shell python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null) \
             $(shell $(NVCC) -dryrun -x cu /dev/null -o /dev/null 2>&1 | sed -n 's/^\#\$$ TOP= *//p')
NCCL_HOME ?= $(abspath $(firstword $(foreach d,$(NCCL_TRY),$(if $(wildcard $(d)/include/nccl.h),$(d)))))
ifneq ($(wildcard $(NCCL_HOME)/include/nccl.h),)
$(info ✓ NCCL from $(NCCL_HOME))
NVFLAGS += -DTD_HAVE_NCCL=1 -I$(NCCL_HOME)/include
CFLAGS  += -DTD_HAVE_NCCL=1
LDLIBS  += -L$(NCCL_HOME)/lib -Wl,-rpath,$(NCCL_HOME)/lib -l:libnccl.so.2
else
$(info ✗ NCCL not found (NCCL_HOME, or pip's nvidia-nccl-cu13): one GPU a model, --gpus N unavailable)
endif
endif
endif
endif

LIB_SRC  := $(wildcard model/*.c kernels/*.c metadata/*.c draft/*.c verify/*.c engine/*.c tokenizer/*.c serve/*.c app/*.c)
LIB_SRC  := $(filter-out app/main.c,$(LIB_SRC))
LIB_ASM  := serve/web.S
LIB_OBJ  := $(LIB_SRC:%=$(BUILD)/%.o) $(CU_SRC:%=$(BUILD)/%.o) $(LIB_ASM:%=$(BUILD)/%.o)
TEST_SRC := $(wildcard tests/test_*.c)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)

all: bin/tandem

# Objects are rebuilt when the flags change (a CPU-only build before nvcc or NCCL was found,
# DEPS=, CFLAGS=...): the flags live in $(BUILD)/flags, rewritten when they differ (not by goals
# that build nothing here: print-%, fuzz, format, clean), and every object depends on that file.
# Otherwise a stale object built without TD_HAVE_NCCL links beside the NCCL one, and the link
# fails.
FLAGS_FILE := $(BUILD)/flags
FLAGS_NOW  := $(CC) $(CFLAGS) $(if $(CU_SRC),; $(NVCC) $(NVFLAGS)) ; $(LDFLAGS) $(LDLIBS)
ifeq ($(filter print-% fuzz format clean,$(MAKECMDGOALS)),)
ifneq ($(FLAGS_NOW),$(file <$(FLAGS_FILE)))
$(shell mkdir -p $(BUILD))
$(file >$(FLAGS_FILE),$(FLAGS_NOW))
endif
endif

# the program: bin/tandem, and beside each build's objects (build-san/tandem for test-san)
bin/tandem $(BUILD)/tandem: $(BUILD)/app/main.c.o $(BUILD)/libtandem.a
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/libtandem.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/%.c.o: %.c $(FLAGS_FILE)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -c -o $@ $<

# the chat page, built in (.incbin reads it at assembly time)
$(BUILD)/serve/web.S.o: serve/web.S serve/web/index.html
	@mkdir -p $(@D)
	$(CC) -c -o $@ $<

$(BUILD)/%.cu.o: %.cu $(FLAGS_FILE)
	@mkdir -p $(@D)
	$(NVCC) $(NVFLAGS) -c -o $@ $<

$(BUILD)/tests/%: $(BUILD)/tests/%.c.o $(BUILD)/libtandem.a
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

tests: $(TEST_BIN)

# measurement programs (bench/*.c), not part of the test run
BENCH_BIN := $(patsubst bench/%.c,$(BUILD)/bench/%,$(wildcard bench/*.c))
$(BUILD)/bench/%: $(BUILD)/bench/%.c.o $(BUILD)/libtandem.a
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)
bench-bins: $(BENCH_BIN)

# every test binary prints OK/FAIL lines; tests/run.sh sums them into "N passed, N failed"
# tests/serve/run.sh: the server driven by real clients (Node's test runner, the openai package)
# tests/test_literals.sh: every (struct x){...} names its fields; tests/test_make.sh: new flags rebuild
test-cpu: bin/tandem $(TEST_BIN)
	@TD_TANDEM=bin/tandem sh tests/run.sh $(BUILD) $(TEST_BIN) tests/serve/run.sh tests/test_literals.sh tests/test_make.sh

test: test-cpu
	@$(MAKE) --no-print-directory SANITIZER=address,undefined test-san

test-san: $(TEST_BIN) $(BUILD)/tandem
	@ASAN_OPTIONS=detect_leaks=1:protect_shadow_gap=0 TD_TEST_QUICK=1 TD_TANDEM=$(BUILD)/tandem sh tests/run.sh $(BUILD) $(TEST_BIN) tests/serve/run.sh

# GPU tests (an sm_90 device): every CUDA op against its reference, whole models against HF
test-gpu: bin/tandem $(BUILD)/tests/test_gpu
	@sh tests/run.sh $(BUILD) $(BUILD)/tests/test_gpu

sanitize-gpu: $(BUILD)/tests/test_gpu
	TD_TEST_FORK=0 compute-sanitizer --tool memcheck --error-exitcode 1 $(BUILD)/tests/test_gpu

# coverage-guided fuzzing of the parsers (clang libFuzzer): make fuzz [FUZZ_SECONDS=30]
FUZZ_SECONDS ?= 30
fuzz:
	sh tests/fuzz.sh $(FUZZ_SECONDS)

# what tests/fuzz.sh links, from this file: make -s NVCC=/nonexistent print-LDLIBS
print-%:
	@echo '$($*)'

format:
	clang-format -i $(wildcard */*.c */*.h */*.cu */*.cuh)

clean:
	rm -rf build build-san build-debug build-fuzz bin

.PHONY: all tests bench-bins fuzz test test-cpu test-san test-gpu sanitize-gpu format clean
.SECONDARY:
-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
