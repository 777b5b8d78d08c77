package servingfixes;

import java.lang.reflect.Field;
import java.util.ArrayList;
import java.util.ConcurrentModificationException;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentMap;
import java.util.concurrent.Executors;
import java.util.concurrent.LinkedBlockingDeque;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.ReentrantLock;
import java.util.function.Function;
import org.pytorch.serve.archive.model.ModelNotFoundException;
import org.pytorch.serve.archive.model.ModelVersionNotFoundException;
import org.pytorch.serve.http.BadRequestException;
import org.pytorch.serve.http.StatusResponse;
import org.pytorch.serve.job.Job;
import org.pytorch.serve.util.ApiUtils;
import org.pytorch.serve.util.ConfigManager;
import org.pytorch.serve.util.NettyUtils;
import org.pytorch.serve.util.messages.ModelWorkerResponse;
import org.pytorch.serve.util.messages.Predictions;
import org.pytorch.serve.util.messages.WorkerCommands;
import org.pytorch.serve.wlm.BatchAggregator;
import org.pytorch.serve.wlm.ContinuousBatching;
import org.pytorch.serve.wlm.Model;
import org.pytorch.serve.wlm.ModelManager;
import org.pytorch.serve.wlm.WorkerInitializationException;

import io.netty.handler.codec.http.QueryStringDecoder;

/**
 * Replacements for three call sites of TorchServe 0.12's frontend (scripts/frontend_fixes/patch_jar.py rewrites each
 * call to the method of the same shape here). TorchServe is archived upstream; these keep one management call from
 * stopping a model or the host.
 *
 * <ul>
 *   <li>{@link #pollContinuousBatch}: ContinuousBatching's poll. 0.12's Model.pollInferJob puts a customized
 *       describe it takes as a batch's first job back at the head of the queue as well as into the batch, so the same
 *       describe is taken again every time the worker's batch is empty: the worker answers it hundreds of times a
 *       second and serves nothing else. And a worker with rows running waits for the model's queue lock, which an idle
 *       worker holds for as long as it waits for its first job: with two workers, a running generation stops until
 *       another request arrives.
 *   <li>{@link #updateModelWorkers}: worker counts from the scale and register calls (REST and gRPC) are checked: a
 *       negative count took every worker away (IndexOutOfBoundsException), a huge one started workers until the host
 *       stopped answering.
 *   <li>{@link #intParameter}: a management call's integer parameter that is not an integer is refused, not read as
 *       its default (min_worker=abc scaled a model to one worker).
 *   <li>{@link #unregisterModel} and scaling to 0 ({@link #updateModelWorkers}): the requests still queued for the
 *       model, and those its stopped workers held (TorchServe puts them back in the queue), are answered 503 (after
 *       unregistering at once; after a scale to 0 once the model has stayed without workers for {@value
 *       #ZERO_WORKERS_GRACE_SECONDS} s, so a restart of its workers keeps its queue). 0.12 left them unanswered: the
 *       clients waited until their own timeout.
 *   <li>{@link #sendResponse}: a continuousBatching worker may send stream pieces in the middle of a call (several
 *       decoding steps in one call, each step's text sent as it comes). 0.12 took any message as the call's answer:
 *       the worker's real answer then went to the next call, and every answer after it to the wrong one.
 *   <li>{@link #releaseJobs}: a worker thread that stops (scaled down, unregistered, its process died) while it was
 *       collecting a batch dropped the requests it had taken but not yet sent to its process; they go back to the
 *       queue for another worker now, or are answered 503 when the model has no workers left.
 * </ul>
 */
public final class FrontendFixes {
    /** config.properties key: the most workers one model may be scaled or registered to. */
    public static final String MAX_WORKERS_KEY = "max_workers_per_model";

    /** How long requests queued for a model scaled to 0 wait for workers to come back before they are answered. */
    public static final long ZERO_WORKERS_GRACE_SECONDS = 10;

    private static final ScheduledExecutorService LATER =
            Executors.newSingleThreadScheduledExecutor(
                    work -> {
                        Thread thread = new Thread(work, "serving-fixes");
                        thread.setDaemon(true);
                        return thread;
                    });
    private static final Field LOCK = field("lock");
    private static final Field JOBS_DB = field("jobsDb");

    private FrontendFixes() {}

    private static final Field AGGREGATOR_JOBS = field(BatchAggregator.class, "jobs");
    private static final Field AGGREGATOR_MODEL = field(BatchAggregator.class, "model");

    private static Field field(String name) {
        return field(Model.class, name);
    }

    private static Field field(Class<?> owner, String name) {
        try {
            Field found = owner.getDeclaredField(name);
            found.setAccessible(true);
            return found;
        } catch (NoSuchFieldException e) {
            throw new IllegalStateException(
                    "TorchServe's " + owner.getSimpleName() + " has no field " + name + ": not the 0.12.0 frontend",
                    e);
        }
    }

    private static Object read(Field field, Object owner) {
        try {
            return field.get(owner);
        } catch (IllegalAccessException e) {
            throw new IllegalStateException(e);
        }
    }

    /** Replaces {@code model.pollInferJob(jobs, quota)} in ContinuousBatching.pollBatch. */
    @SuppressWarnings("unchecked")
    public static void pollContinuousBatch(Model model, Map<String, Job> jobs, int quota)
            throws InterruptedException {
        ReentrantLock lock = (ReentrantLock) read(LOCK, model);
        LinkedBlockingDeque<Job> queue =
                ((ConcurrentMap<String, LinkedBlockingDeque<Job>>) read(JOBS_DB, model))
                        .get(Model.DEFAULT_DATA_QUEUE);
        if (jobs.isEmpty()) {
            // Idle: wait for the first job as TorchServe does (holding the lock keeps one batch's jobs together),
            // then take a describe out of the queue for good: it is answered once, alone.
            if (model.isUseJobTicket()) {
                model.incNumJobTickets();
            }
            lock.lockInterruptibly();
            try {
                model.pollInferJob(jobs, quota, queue);
                for (Job job : jobs.values()) {
                    if (job.getCmd() == WorkerCommands.DESCRIBE) {
                        queue.removeFirstOccurrence(job);
                    }
                }
            } finally {
                lock.unlock();
            }
            return;
        }
        // Rows are running: top the batch up without waiting. If another worker holds the lock (an idle one waiting
        // for its first job), this step goes on with the rows it has; the next step tries again.
        if (lock.tryLock()) {
            try {
                model.pollInferJob(jobs, quota, queue);
            } finally {
                lock.unlock();
            }
        }
    }

    /** The largest worker count a scale or register call may ask for ({@value #MAX_WORKERS_KEY}). */
    public static int maxWorkersPerModel() {
        int fallback = Math.max(4, 2 * Runtime.getRuntime().availableProcessors());
        String configured = ConfigManager.getInstance().getProperty(MAX_WORKERS_KEY, null);
        if (configured == null) {
            return fallback;
        }
        try {
            return Integer.parseInt(configured.trim());
        } catch (NumberFormatException e) {
            return fallback;
        }
    }

    /** Replaces every call of {@code ApiUtils.updateModelWorkers} (REST scale and register, gRPC scale). */
    public static StatusResponse updateModelWorkers(
            String modelName,
            String modelVersion,
            int minWorkers,
            int maxWorkers,
            boolean synchronous,
            boolean isInit,
            Function<Void, Void> onError)
            throws ModelVersionNotFoundException, ModelNotFoundException,
                    java.util.concurrent.ExecutionException, InterruptedException,
                    WorkerInitializationException {
        int limit = maxWorkersPerModel();
        String problem = null;
        if (minWorkers < 0 || maxWorkers < 0) {
            problem = "worker counts must be 0 or more; got min_worker=" + minWorkers + ", max_worker=" + maxWorkers;
        } else if (maxWorkers > limit || minWorkers > limit) {
            problem =
                    "at most "
                            + limit
                            + " workers per model ("
                            + MAX_WORKERS_KEY
                            + " in config.properties); got min_worker="
                            + minWorkers
                            + ", max_worker="
                            + maxWorkers;
        }
        if (problem != null) {
            if (isInit && onError != null) {
                // A registration asking for a bad count: the model it just registered goes again, as when its
                // workers fail to start.
                onError.apply(null);
            }
            throw new BadRequestException(problem);
        }
        Model model = maxWorkers == 0 ? findModel(modelName, modelVersion) : null;
        StatusResponse response =
                ApiUtils.updateModelWorkers(
                        modelName, modelVersion, minWorkers, maxWorkers, synchronous, isInit, onError);
        if (model != null) {
            // No worker will take what waits (and what the stopped workers held) unless workers come back: a scale
            // to 0 and back (a restart of the workers) keeps its queue; a model left at 0 answers it 503, TorchServe's
            // own answer to a request for a model without workers, instead of silence.
            Model scaled = model;
            LATER.schedule(
                    () -> {
                        if (scaled.getMaxWorkers() == 0) {
                            answerQueued(
                                    scaled,
                                    "Model "
                                            + modelName
                                            + " was scaled to 0 workers before this request was served");
                        }
                    },
                    ZERO_WORKERS_GRACE_SECONDS,
                    TimeUnit.SECONDS);
        }
        return response;
    }

    private static Model findModel(String modelName, String modelVersion) {
        try {
            return ModelManager.getInstance().getModel(modelName, modelVersion);
        } catch (ModelVersionNotFoundException e) {
            return null;
        }
    }

    /** Answers 503 to every job still queued for {@code model} (its data queue and its workers' own queues). */
    @SuppressWarnings("unchecked")
    static int answerQueued(Model model, String message) {
        int answered = 0;
        for (LinkedBlockingDeque<Job> queue :
                ((ConcurrentMap<String, LinkedBlockingDeque<Job>>) read(JOBS_DB, model)).values()) {
            Job job;
            while ((job = queue.poll()) != null) {
                job.sendError(503, message);
                answered++;
            }
        }
        return answered;
    }

    /** Replaces {@code modelManager.unregisterModel(name, version)} in ApiUtils.unregisterModel (REST and gRPC). */
    public static int unregisterModel(ModelManager manager, String modelName, String modelVersion) {
        Model model = findModel(modelName, modelVersion);
        int status = manager.unregisterModel(modelName, modelVersion);
        if (model != null && status == 200) {
            answerQueued(model, "Model " + modelName + " was unregistered before this request was served");
        }
        return status;
    }

    /** Replaces {@code NettyUtils.getIntParameter} in the management API's request parsing. */
    public static int intParameter(QueryStringDecoder decoder, String key, int fallback) {
        String value = NettyUtils.getParameter(decoder, key, null);
        if (value == null) {
            return fallback;
        }
        try {
            return Integer.parseInt(value);
        } catch (NumberFormatException e) {
            throw new BadRequestException(
                    "parameter " + key + " must be an integer; got '" + value + "'");
        }
    }

    /** Replaces {@code aggregator.cleanJobs()} where a worker thread stops (WorkerThread.run's finally). */
    @SuppressWarnings("unchecked")
    public static void releaseJobs(BatchAggregator aggregator) {
        Map<String, Job> jobs = (Map<String, Job>) read(AGGREGATOR_JOBS, aggregator);
        Model model = (Model) read(AGGREGATOR_MODEL, aggregator);
        List<Job> left = new ArrayList<>();
        for (int attempt = 0; attempt < 3; attempt++) {
            try {
                left = new ArrayList<>(jobs.values());
                break;
            } catch (ConcurrentModificationException e) {
                // the scale-down's own sendError is going over the same jobs: look again
                left = new ArrayList<>();
            }
        }
        aggregator.cleanJobs();
        boolean served = model.getMaxWorkers() > 0 && stillRegistered(model);
        for (Job job : left) {
            if (job == null || job.isControlCmd()) {
                continue;
            }
            if (served) {
                model.addFirst(job);
            } else {
                job.sendError(
                        503,
                        "Model "
                                + model.getModelName()
                                + " stopped its workers before this request was served");
            }
        }
    }

    private static boolean stillRegistered(Model model) {
        try {
            return ModelManager.getInstance().getModel(model.getModelName(), model.getVersion()) == model;
        } catch (ModelVersionNotFoundException | RuntimeException e) {
            return false;
        }
    }

    /**
     * The message of a continuousBatching worker's stream pieces sent in the middle of a call (the generator's
     * handlers/generation/streaming.py STEP_PIECES).
     */
    public static final String STEP_PIECES = "serving-fixes: step pieces";

    /**
     * Replaces {@code aggregator.sendResponse(reply)} in WorkerThread.run. A continuousBatching worker's message
     * marked {@link #STEP_PIECES} carries stream pieces of a call still running: each open job gets its piece, the
     * batch stays as it is, and the worker thread waits for the call's answer (false: not the last message of the
     * call). Every other message is 0.12's.
     */
    @SuppressWarnings("unchecked")
    public static boolean sendResponse(BatchAggregator aggregator, ModelWorkerResponse message) {
        if (!(aggregator instanceof ContinuousBatching)
                || message.getCode() != 200
                || !STEP_PIECES.equals(message.getMessage())) {
            return aggregator.sendResponse(message);
        }
        Map<String, Job> jobs = (Map<String, Job>) read(AGGREGATOR_JOBS, aggregator);
        long now = System.currentTimeMillis();
        for (Predictions prediction : message.getPredictions()) {
            Job job = jobs.get(prediction.getRequestId());
            if (job == null || !job.isOpen() || job.getPayload().getClientExpireTS() <= now) {
                continue; // gone: the call's answer, or the next step's batch, drops it as 0.12 does
            }
            job.response(
                    prediction.getResp(),
                    prediction.getContentType(),
                    prediction.getStatusCode(),
                    prediction.getReasonPhrase(),
                    prediction.getHeaders());
        }
        return false;
    }
}
